package fuzz

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmmalloc/vmmalloc/backend"
)

// prog builds the bytes that step decodes, for seeds and the fault sweep.
type prog struct{ b []byte }

// Size classes of harness.sizeFor.
const (
	szTiny byte = iota
	szSmall
	szBoundary
	szJustLarge
	szEighth
	szPages
	szQuarter
	szHuge
)

// stream bytes: streamDefault passes 0 to the allocator; sN names extra
// stream N (1..); launch adds work touching the block on that stream.
const (
	streamDefault byte = 0
	launch        byte = 0x40
)

func (p *prog) malloc(class byte, v uint16, stream byte) *prog {
	p.b = append(p.b, opByte(kMalloc), class, byte(v), byte(v>>8), stream)
	return p
}

func (p *prog) free(i byte) *prog { p.b = append(p.b, opByte(kFree), i); return p }

// freeAny frees a pointer drawn from the whole address space: kind k (the
// low four bits of pointerArg's x) and its byte y.
func (p *prog) freeAny(k, y byte) *prog {
	p.b = append(p.b, opByte(kFree), anyPointer|k&0x0f, y)
	return p
}

// recordAny is RecordStream on a pointer drawn from the whole address space.
func (p *prog) recordAny(k, y, stream byte) *prog {
	p.b = append(p.b, opByte(kRecord), anyPointer|k&0x0f, stream, y)
	return p
}

// release releases stream 1+i%(n-1) with ReleaseStream and destroys it;
// destroy destroys it without ReleaseStream. A new stream takes its place.
func (p *prog) release(i byte) *prog { p.b = append(p.b, opByte(kBad), 5, i); return p }
func (p *prog) destroy(i byte) *prog { p.b = append(p.b, opByte(kBad), 6, i); return p }

func (p *prog) record(i, stream byte) *prog {
	p.b = append(p.b, opByte(kRecord), i, stream)
	return p
}

// complete completes n (0 = all) pending launches of a stream.
func (p *prog) complete(stream, n byte) *prog {
	p.b = append(p.b, opByte(kComplete), stream, n)
	return p
}

func (p *prog) completeAll() *prog { p.b = append(p.b, opByte(kCompleteAll)); return p }
func (p *prog) emptyCache() *prog  { p.b = append(p.b, opByte(kEmptyCache)); return p }
func (p *prog) sync(stream byte) *prog {
	p.b = append(p.b, opByte(kSynchronize), stream)
	return p
}

func (p *prog) fault(op backend.Op, n byte, kind byte) *prog {
	oi := -1
	for i, o := range faultOps {
		if o == op {
			oi = i
		}
	}
	if oi < 0 {
		panic(fmt.Sprintf("op %v is not a fault op", op))
	}
	p.b = append(p.b, opByte(kFault), byte(oi), n-1, kind)
	return p
}

// Flags of prog.sleep (sleep_test.go).
const (
	sleepOffload byte = 0x80 // Offload, else Discard
	sleepPinned  byte = 0x40 // pinned host memory (real memory only)
	sleepKeep    byte = 0x20 // KeepHostBuffers
)

// sleep sleeps pool i of the harness (0: the default pool; with pools, 1
// limited, 2 isolated, 3 classic); wake wakes it.
func (p *prog) sleep(pool, flags byte) *prog {
	p.b = append(p.b, sleepOpByte, pool&7<<2|flags&0xe0)
	return p
}
func (p *prog) wake(pool byte) *prog { p.b = append(p.b, sleepOpByte, pool&7<<2|3); return p }

// mallocIn is malloc in pool i (FuzzAllocator's pools; the default pool
// without them).
func (p *prog) mallocIn(pool, class byte, v uint16, stream byte) *prog {
	return p.malloc(class|pool<<3, v, stream)
}

func (p *prog) clearFaults() *prog { p.b = append(p.b, opByte(kClearFaults)); return p }
func (p *prog) bad(x byte) *prog   { p.b = append(p.b, opByte(kBad), x); return p }

// seedProgs are meaningful operation sequences, one seed file each.
func seedProgs() map[string][]byte {
	seeds := map[string][]byte{}
	// Grow, free in the middle, reuse, empty the cache.
	p := &prog{}
	for i := 0; i < 8; i++ {
		p.malloc(szSmall, uint16(1000*i), streamDefault|launch)
		p.malloc(szJustLarge, uint16(300*i), 1)
	}
	p.free(3).free(7).free(1).malloc(szTiny, 100, streamDefault).completeAll().emptyCache()
	seeds["grow_shrink"] = p.b

	// A block freed while another stream's work still uses it.
	p = &prog{}
	p.malloc(szPages, 3, 1|launch).record(0, 2|launch).free(0)
	p.malloc(szPages, 3, 1).malloc(szPages, 3, 1).complete(2, 0).malloc(szPages, 3, 1).emptyCache()
	seeds["record_stream"] = p.b

	// Fill the device until out of memory, on two streams, then retry.
	p = &prog{}
	for i := 0; i < 6; i++ {
		p.malloc(szQuarter, uint16(9000*i), byte(i%2+1)|launch)
	}
	p.free(0).free(0).malloc(szQuarter, 60000, 3).completeAll().malloc(szHuge, 10, 1)
	seeds["oom_ladder"] = p.b

	// Faults in the middle of growth and release.
	p = &prog{}
	p.fault(backend.OpCreate, 2, 0).malloc(szEighth, 40000, 1)
	p.fault(backend.OpMap, 1, 1).malloc(szPages, 7, 1)
	p.malloc(szEighth, 2000, 2).free(0).fault(backend.OpUnmap, 1, 1).emptyCache()
	p.fault(backend.OpStreamSync, 1, 1).sync(1).clearFaults().emptyCache()
	seeds["faults"] = p.b

	// Event query and synchronisation failures with pending frees.
	p = &prog{}
	p.malloc(szSmall, 500, 1).record(0, 2|launch).free(0)
	p.fault(backend.OpEventQuery, 1, 1).malloc(szSmall, 500, 1)
	p.fault(backend.OpEventSync, 1, 1).emptyCache().complete(2, 0).malloc(szSmall, 500, 1).emptyCache()
	seeds["event_faults"] = p.b

	// Bad input between real work.
	p = &prog{}
	p.malloc(szTiny, 4000, streamDefault).free(0).bad(2).malloc(szBoundary, 1, 1).bad(1).bad(0).bad(3).bad(4)
	seeds["bad_input"] = p.b

	// Pointers from the whole address space between real work: null, one, the top, near live blocks, freed, around and deep in
	// reservations, another allocator's; Free(0) many times, then growth.
	p = &prog{}
	p.malloc(szTiny, 4000, streamDefault).malloc(szJustLarge, 7, 1).malloc(szPages, 2, 2|launch)
	for k := byte(0); k < 16; k++ {
		p.freeAny(k, 0x11*k).recordAny(k, 0x23*k, 1)
	}
	p.free(0)
	for k := 0; k < 40; k++ {
		p.freeAny(0, 0)
	}
	for k := 0; k < 20; k++ {
		p.malloc(szSmall, uint16(977*k), byte(k%3))
	}
	p.freeAny(7, 0).freeAny(9, 0x40).freeAny(11, 3).emptyCache()
	seeds["pointer_space"] = p.b

	// Streams released and destroyed, with blocks still live on them and
	// work pending.
	p = &prog{}
	p.malloc(szSmall, 100, 1|launch).malloc(szPages, 4, 1).malloc(szEighth, 900, 2|launch).record(0, 2|launch)
	p.release(0).free(1).malloc(szSmall, 100, 1).destroy(1).malloc(szPages, 4, 3)
	p.free(0).emptyCache().malloc(szQuarter, 100, 2).malloc(szQuarter, 60000, 3).malloc(szHuge, 1, 1)
	p.completeAll().release(2).destroy(0).sync(2).emptyCache()
	p.malloc(szSmall, 7, 2).record(0, 1|launch).release(0x81).free(0).malloc(szSmall, 9, 1).completeAll().emptyCache()
	seeds["stream_lifecycle"] = p.b

	// Sleep and wake (sleep_test.go): a pool asleep refuses Malloc and
	// RecordStream, frees work, another pool takes its memory, its wake
	// finds no room and then does; offloads (refused without real
	// memory), a classic pool, faults in Sleep's unmap and free and in
	// Wake's create and map.
	p = &prog{}
	p.mallocIn(1, szEighth, 20000, 1|launch).mallocIn(1, szSmall, 300, 1).mallocIn(1, szPages, 2, 2)
	p.mallocIn(2, szPages, 1, 1).mallocIn(0, szJustLarge, 50, streamDefault|launch)
	p.sleep(1, sleepOffload|sleepPinned).sleep(1, 0).sleep(1, 0).mallocIn(1, szTiny, 5, 1).record(0, 2).record(1, 1)
	p.free(1).mallocIn(2, szQuarter, 60000, 2).mallocIn(2, szQuarter, 60000, 1).wake(1).free(3).free(3)
	p.completeAll().wake(1).wake(1).sleep(3, 0).sleep(0, sleepOffload|sleepKeep).wake(0)
	p.fault(backend.OpUnmap, 1, 1).sleep(2, 0).clearFaults().fault(backend.OpFree, 1, 1).sleep(2, sleepOffload)
	p.clearFaults().fault(backend.OpCreate, 1, 0).wake(2).fault(backend.OpMap, 1, 1).wake(2).clearFaults().wake(2)
	p.sleep(0, sleepOffload|sleepPinned|sleepKeep).free(0).wake(0).sleep(0, sleepOffload|sleepPinned|sleepKeep)
	p.mallocIn(2, szSmall, 9, 1).wake(0).emptyCache()
	seeds["sleep_wake"] = p.b
	return seeds
}

// configSeeds prefixes programs with FuzzAllocatorConfig's four config bytes.
var configSeeds = map[string][4]byte{
	"classic_maxsplit":   {0x11, 0x00, 0x00, 0x01}, // classic, max_split 20, 512 MiB
	"expandable_release": {0x00, 0x06, 0x00, 0x00}, // release threshold 4 MiB, cache 8 MiB, 256 MiB
	"small_va_budget":    {0x06, 0x10, 0x00, 0x06}, // 4 MiB small pages, 1 segment per pool
	"fraction_gc":        {0x20, 0x20, 0x05, 0x02}, // fraction 0.75, gc 0.5, 1 GiB
	"defrag_off":         {0x00, 0x0c, 0x10, 0x00}, // defrag off, no handle cache
	"classic_close_live": {0x01, 0x00, 0x02, 0x11}, // classic, fraction 0.5, close with live blocks
}

var parseSeeds = []string{
	"",
	"expandable_segments:True",
	"expandable_segments:False,max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8]",
	"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
	"roundup_power2_divisions:4, release_threshold_mb:none",
	"small_segment_size_mb:4,large_segment_size_mb:2",
	"max_split_size_mb:19",
	"unknown_key:1",
	"max_split_size_mb",
	"roundup_power2_divisions:[1:3]",
	"roundup_power2_divisions:[8:1,4:2]",
	"backend:cudaMallocAsync",
	"handle_cache_mb:0,max_segments_per_pool:64",
	"defrag_threshold:off",
	"defrag_threshold:0.25,expandable_segments:1",
	"defrag_threshold:-1",
}

// TestGenerateSeeds rewrites the generated seed files under testdata/fuzz
// when VMMALLOC_GEN_SEEDS=1 (crashers found by fuzzing are kept by hand).
func TestGenerateSeeds(t *testing.T) {
	if os.Getenv("VMMALLOC_GEN_SEEDS") != "1" {
		t.Skip("set VMMALLOC_GEN_SEEDS=1 to rewrite the seed corpus")
	}
	write := func(target, name, value string) {
		dir := filepath.Join("testdata", "fuzz", target)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		body := "go test fuzz v1\n" + value + "\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(body), 0o644))
	}
	bytesLit := func(b []byte) string { return "[]byte(" + strconv.Quote(string(b)) + ")" }
	for name, b := range seedProgs() {
		write("FuzzAllocator", name, bytesLit(b))
		write("FuzzRealMemory", name, bytesLit(append([]byte{0}, b...)))
		write("FuzzRealMemory", name+"_classic", bytesLit(append([]byte{2}, b...)))
	}
	progs := seedProgs()
	for name, c := range configSeeds {
		for _, pn := range []string{"grow_shrink", "oom_ladder", "faults"} {
			write("FuzzAllocatorConfig", name+"_"+pn, bytesLit(append(c[:], progs[pn]...)))
		}
	}
	for i, s := range parseSeeds {
		write("FuzzParseConfig", fmt.Sprintf("%02d", i), "string("+strconv.Quote(s)+")")
	}
}
