// Package replay drives vmmalloc's caching allocator with an allocation
// trace over the emulated backend and measures what the allocator did:
// how much device memory it mapped compared with what the trace needed,
// how fragmented it was over time, how many driver calls it made and how
// long they would have taken, and how fast the replay ran. It answers the
// researcher's questions "how much memory will my workload really need?"
// (MinCapacity), "which policy wastes least?" (Compare) and "how do these
// policies fare across my traces?" (Sweep).
//
// # Replay
//
// Run reads events one at a time (a million-event trace is never held
// whole) and applies each to a fresh allocator over a fresh
// emulated.Emulator with the accounting backing (no host memory is
// touched; device capacity is only counted):
//
//	Alloc         → Malloc(size, stream)        remembers id → address
//	                pool.Malloc(size, stream)   in a private pool (below)
//	Free          → Free(address of id)         unknown ids are skipped and counted
//	RecordStream  → RecordStream(address, stream)
//	StreamSync    → Synchronize(stream)
//	EmptyCache    → EmptyCache()                skipped with Options.IgnoreReleases;
//	                                            the default pool's only once private pools exist
//	Mark          → nothing (counted)
//
// An Alloc in a pool other than the default one (trace.Event.Pool: the
// pools PyTorch gives CUDA graphs and torch.cuda.MemPool) is made in an
// allocator Pool of its own, created with that PoolID the first time, so a
// graph-capture trace replays with the graph's memory kept apart as
// PyTorch keeps it. An EmptyCache event then releases only the default
// pool's cache, as PyTorch's empty_cache leaves a live graph pool's
// memory alone. Report.Pools gives each pool's peaks (pools.go).
//
// Trace stream 0 is the allocator's default stream; every other trace
// stream becomes an emulator stream created the first time it is seen.
// An Alloc that fails with out-of-memory is counted and its id remembered
// as failed, so its Free and RecordStream events are skipped too; with
// Options.StopOnOOM the replay stops there instead.
//
// EmptyCache events are the releases a trace records. The PyTorch
// importer infers them from the segments PyTorch freed (trace.PyTorchTrace
// Releases): replaying them reproduces what the program did (its
// empty_cache calls, PyTorch's release-and-retry), which is what a
// comparison with PyTorch's recorded reserved memory needs; ignoring them
// measures what the allocator reserves on its own. Report.ReleasesApplied
// and ReleasesIgnored count both.
//
// Each id moves through a small state machine:
//
//	unseen ──Alloc ok──▶ live ──Free──▶ unseen
//	   │                   └──RecordStream──▶ live
//	   └──Alloc OOM──▶ failed ──Free──▶ unseen
//
// The replay loop makes no Go heap allocation per event (beyond the first
// event of each private pool, which makes its record): dense ids (those
// of every generator and importer: 1, 2, 3, …) index a slice of slots
// that doubles as ids reach its end, ids far beyond it go to a map, and
// the last stream looked up is cached. The allocator's allocated and
// reserved bytes are read every stride events (16 at first) into a
// bounded time series of Options.MaxSamples samples: when it is full,
// every other sample is dropped and the stride doubles. Stats, Snapshot
// and Check are read once, after the last event.
//
// # Figures
//
// Peak live is the peak of bytes the trace holds (requested sizes, Alloc
// minus Free, failed allocations included: it is the workload's demand,
// independent of the policy). Peak allocated and peak reserved come from
// the allocator's statistics (rounded block bytes and mapped bytes). Their
// ratio to peak live is the memory the policy wastes at its worst moment.
// MinCapacity bisects the device capacity for the smallest one at which
// the whole trace replays without an out-of-memory error, at a 2 MiB
// resolution (the emulator's granularity), running one replay per core in
// each round; its ratio to peak live is the answer to "will my model fit".
//
// # Sweeps
//
// Sweep runs a grid of policies × traces: each cell is a replay plus, with
// Options.MinCapacity, a capacity search. Cells run in an errgroup limited
// to SweepOptions.Parallel (GOMAXPROCS by default), each search then going
// one replay at a time so the cells fill the cores. The group's context is
// threaded into every replay (RunContext checks it every 4,096 events), so
// the first cell that fails, or the caller cancelling, stops the others;
// Sweep then returns that error and no runs. Compare is a one-trace Sweep
// that runs one policy at a time, so that events per second compare, and
// the capacity search runs each round's replays in an errgroup the same
// way. WriteSweepMarkdown, WriteSweepCSV and SweepPlot (minimum capacity
// over peak live against driver calls) present the runs.
//
// # Units
//
// Sizes are printed in binary units (FormatBytes: "38.35 GiB", as
// PyTorch's memory_summary does) and counts with thousands separators
// (FormatCount); plots tick their byte axes in KiB, MiB or GiB. Reports
// and CSV carry plain bytes.
//
// # Concurrency
//
// Run, RunContext, MinCapacity, Compare and Sweep are safe for concurrent
// use: each replay owns its emulator and allocator. A Report is a plain
// value.
package replay
