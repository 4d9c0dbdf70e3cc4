// Package fuzz hammers the allocator until it is trusted: operation-sequence
// fuzzing against a slow reference model, the same over real memory with a
// pattern in every live block, config-string fuzzing, a deterministic fault
// sweep over every driver primitive, stream-safety tests with busy streams,
// and a concurrency stress under the race detector. It has no API of its
// own: everything lives in its tests.
//
// # The harness
//
// The operation-sequence targets decode the fuzzer's bytes into calls
// (Malloc on a stream, Free, RecordStream, Launch of device work on a
// held stream, completing a stream's work, EmptyCache, Synchronize, armed
// and cleared driver faults, and bad input) against an allocator over the
// emulated backend with WithManualCompletion, so work stays pending until
// the input completes it. A reference model (the live blocks, what each
// asked for, which streams used them and which freed ranges a still-busy
// stream may touch) sits beside the allocator. After every operation the
// harness requires:
//
//   - Allocator.Check passes;
//   - the allocator's Footprint equals the emulator's reservations and
//     mappings exactly (address and size), its handles equal mapped plus
//     cached, and the emulator records no violation (no unmap or release of
//     memory pending work touches, no work on unmapped memory);
//   - every live block is 512-aligned, at least the size asked for, holds
//     what was asked (Snapshot), and no two live blocks overlap;
//   - the statistics equal the model's: allocation count, allocated,
//     requested and active bytes (current and accumulated), reserved bytes
//     equal to the segments' mapped bytes, and every Stat's current value
//     equal to its allocated minus freed;
//   - a range freed while another stream's work still touches it is not
//     handed to any other stream until that work completes;
//   - an operation either succeeds or fails with an error that errors.Is
//     matches an allocator or backend sentinel, and fails only when an
//     injected fault fired during it, the input was bad, or memory really
//     ran out (an OutOfMemoryError whose device free memory is below what
//     it tried to map).
//
// With real memory (FuzzRealMemory, Linux, a 32 MiB device with a 64 KiB
// granularity and 1–2 MiB pages) every live block holds a pattern unique to
// it, read and written through the emulator's Bytes (which fails unless the
// range is mapped and accessible), and every live block, and every freed
// block a busy stream still uses, is verified after every operation. Blocks
// up to 4 KiB hold the pattern in every byte; larger ones in one word of
// every 512-byte unit and their last word: the allocator hands out whole
// 512-byte units, so a unit handed out twice or remapped to other memory
// loses its word.
//
// At the end of every input the harness completes all work, clears the
// faults, frees everything, empties the cache (reserved memory must drop to
// zero) and closes the allocator: the emulator must then hold no handle,
// mapping, reservation, event or physical memory.
//
// # Regressions
//
// Every bug fuzzing finds in another package gets a TestRegression_<what>
// test (regress_test.go) with the smallest reproduction, and the crashing
// input stays in testdata/fuzz/<Target>/ (named crash_<what>). A test for
// a bug not fixed yet skips with t.Skip("bug: ...") so that the tree stays
// green (none is open now).
//
// # Trace readers
//
// The trace readers take files from strangers, so each has a target
// (readers_test.go): FuzzPickle (package pickle's decoder), FuzzPyTorchSnapshot,
// FuzzRMMLog, FuzzBinaryTrace and FuzzTextTrace. Each requires that an
// input reads or fails with the reader's sentinel error, that what reads
// is consistent (imports are valid traces whose summary agrees with the
// importer's counts; both writers accept and reproduce whatever a reader
// produced, Info included, which is what convert does), and that the
// reader allocates at most a fixed multiple of the input's size plus a
// constant (readerBounds). Seeds are generated files, hostile pickle
// shapes (deep or cyclic containers, huge keys), and snapshots derived from the real traces in
// shared/traces (found by trace.SharedDir: $VMMALLOC_TRACES, or
// shared/traces beside the module root; whole files when under 256 KiB),
// when present.
//
// # Running
//
// go test ./fuzz runs the seed corpus in testdata/fuzz, every crasher kept
// there, the fault sweep, the stream-safety tests and the stress test. To
// fuzz each target for a bounded time (CI uses 10s):
//
//	fuzz/run.sh 10s
//
// and for hours, one target at a time (each target on all cores; the
// corpus grows under $(go env GOCACHE)/fuzz, and a crasher is written to
// fuzz/testdata/fuzz/<Target>/ where it becomes a regression case):
//
//	go test ./fuzz -run '^$' -fuzz '^FuzzAllocator$' -fuzztime 4h
//	go test ./fuzz -run '^$' -fuzz '^FuzzAllocatorConfig$' -fuzztime 4h
//	go test ./fuzz -run '^$' -fuzz '^FuzzRealMemory$' -fuzztime 4h
//	go test ./fuzz -run '^$' -fuzz '^FuzzParseConfig$' -fuzztime 1h
//
// or fuzz/run.sh 4h, which runs them one after another. The fault sweep
// tries an even sample of 60 call numbers of every primitive (4 under
// -race, where each run costs about 25 times as much); the full sweep
// (every call number) runs with VMMALLOC_SWEEP_FULL=1 go test ./fuzz -run
// TestFaultSweep.
// VMMALLOC_GEN_SEEDS=1 go test ./fuzz -run TestGenerateSeeds rewrites the
// generated part of the seed corpus.
package fuzz
