// Package integrity is the allocator's real-memory integrity test, written
// once and run over every backend that moves bytes (backend.Copier): the
// emulator with real memory, the CUDA binding over its C test double, and
// the real driver on a GPU.
//
// Run drives an allocator with random Malloc/Free traffic from several
// goroutines on several streams. Every block gets a pattern derived from a
// tag when it is allocated, written through CopyHtoD; the patterns of all
// live blocks are read back through CopyDtoH at intervals, and each block's
// pattern is checked again just before it is freed. Two live blocks that
// overlap, a block mapped onto the wrong memory, or memory lost across the
// allocator's unmap/remap of physical handles all show up as a corrupted
// pattern. At the end every block is freed, the allocator is closed, and
// a driver that implements backend.Introspector must hold nothing.
//
// Run and SleepCycles drive the allocator over the driver wrapped in the
// handle-lifetime checker (backend/handlecheck): a handle mapped twice,
// mapped or freed after its free, freed while mapped, or an id the driver
// reuses while live fails the run, even where the allocator recovered from
// the refused call.
//
// Blocks up to FullPattern bytes carry the pattern in every byte; larger
// ones in their first and last 4 KiB and in a 4 KiB window at a
// tag-dependent offset, which keeps the test's copies bounded while still
// covering every page over many blocks.
package integrity

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/handlecheck"
	"github.com/vmmalloc/vmmalloc/stats"
)

// FullPattern is the size up to which a block's pattern covers every byte.
const FullPattern = 64 << 10

// window is the size of a large block's pattern pieces.
const window = 4 << 10

// Options sizes a run. Zero fields take the defaults in parentheses.
type Options struct {
	Config  string // allocator config, as allocator.ParseConfig reads it ("")
	Ops     int    // Malloc/Free operations per worker (400)
	Workers int    // goroutines sharing the allocator, one stream each (3)
	MaxSize uint64 // largest request in bytes (8 MiB)
	MaxLive int    // live blocks per worker (24)
	Seed    uint64 // random seed (1)
	// VerifyEvery is how many operations a worker makes between checks of
	// all its live blocks (16).
	VerifyEvery int
}

func (o *Options) defaults() {
	if o.Ops == 0 {
		o.Ops = 400
	}
	if o.Workers == 0 {
		o.Workers = 3
	}
	if o.MaxSize == 0 {
		o.MaxSize = 8 << 20
	}
	if o.MaxLive == 0 {
		o.MaxLive = 24
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.VerifyEvery == 0 {
		o.VerifyEvery = 16
	}
}

// Result is what a run did, for reports.
type Result struct {
	Mallocs, Frees int   // successful operations, all workers
	OOMs           int   // Mallocs that failed with out of memory
	Verified       int64 // pattern bytes read back and compared
	PeakReserved   uint64
}

// liveSet is every worker's live blocks, so that a Malloc that returns
// memory overlapping another live block (of any worker) is reported at
// once, naming both, rather than later as a corrupted pattern. A block
// leaves it before its Free and joins it after its Malloc, so no correct
// allocator can make two of its entries overlap.
type liveSet struct {
	mu sync.Mutex
	m  map[uintptr]block // by address; guarded by mu
}

// add records b, or returns an error naming the live block it overlaps.
func (l *liveSet) add(b block) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.m {
		if b.ptr < o.ptr+uintptr(max(o.size, 1)) && o.ptr < b.ptr+uintptr(max(b.size, 1)) {
			return fmt.Errorf("Malloc returned %#x+%d (tag %#x), which overlaps live block %#x+%d (tag %#x)",
				b.ptr, b.size, b.tag, o.ptr, o.size, o.tag)
		}
	}
	l.m[b.ptr] = b
	return nil
}

func (l *liveSet) remove(b block) {
	l.mu.Lock()
	delete(l.m, b.ptr)
	l.mu.Unlock()
}

// block is one live allocation of a worker.
type block struct {
	ptr  uintptr
	size uint64 // nbytes asked for
	tag  uint64
}

// Run runs the test on device 0 of d. It skips when d does not implement
// backend.Copier, or its copies are not supported in its configuration.
func Run(t testing.TB, d backend.Driver, o Options) Result {
	t.Helper()
	if o.Ops < 0 || o.Workers < 0 || o.MaxLive < 0 || o.VerifyEvery < 0 {
		t.Fatalf("integrity: negative Options field in %+v (a run that does nothing cannot fail)", o)
	}
	o.defaults()
	chk := handlecheck.New(d)
	d = chk.Driver()
	c, ok := d.(backend.Copier)
	if !ok {
		t.Skipf("integrity: %s driver does not implement backend.Copier", d.Name())
	}
	cfg, err := allocator.ParseConfig(o.Config)
	require.NoError(t, err)
	a, err := allocator.New(d, cfg)
	require.NoError(t, err)
	// However the run ends (a failed require stops this goroutine), the
	// allocator gives back what it holds, so that later tests on the same
	// driver start clean. Close after a successful Close is ErrClosed.
	defer func() { _ = a.Close() }()
	if err := c.CopyHtoD(0, nil, a.DefaultStream()); err != nil {
		t.Skipf("integrity: copies unsupported: %v", err)
	}

	var (
		mu   sync.Mutex
		res  Result
		live = &liveSet{m: map[uintptr]block{}}
	)
	errs := make(chan error, o.Workers)
	var wg sync.WaitGroup
	streams := []backend.Stream{a.DefaultStream()}
	for range o.Workers - 1 { // all made before any worker starts
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		defer func(s backend.Stream) { require.NoError(t, d.StreamDestroy(s)) }(s)
		streams = append(streams, s)
	}
	for w, s := range streams {
		wg.Add(1)
		go func(w int, s backend.Stream) {
			defer wg.Done()
			r, err := (&worker{a: a, c: c, s: s, o: &o, all: live, tagBase: uint64(w+1) << 48,
				rng: rand.New(rand.NewPCG(o.Seed, uint64(w)))}).run()
			mu.Lock()
			res.Mallocs += r.Mallocs
			res.Frees += r.Frees
			res.OOMs += r.OOMs
			res.Verified += r.Verified
			mu.Unlock()
			errs <- err
		}(w, s)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, errors.Join(err, chk.Err()))
	}
	st := a.Stats()
	res.PeakReserved = uint64(st.ReservedBytes[stats.AllPools].Peak)
	require.NoError(t, a.Check())
	require.NoError(t, a.Close())
	require.NoError(t, chk.Err())
	if in, ok := d.(backend.Introspector); ok {
		r, m, h := in.LiveRanges(0)
		require.Empty(t, r, "reservations left after Close")
		require.Empty(t, m, "mappings left after Close")
		require.Zero(t, h, "handles left after Close")
	}
	return res
}

// worker is one goroutine's traffic and model.
type worker struct {
	a       *allocator.Allocator
	c       backend.Copier
	s       backend.Stream
	o       *Options
	all     *liveSet // every worker's live blocks
	rng     *rand.Rand
	tagBase uint64
	live    []block
	res     Result
	buf     []byte
}

func (w *worker) run() (Result, error) {
	for i := 0; i < w.o.Ops; i++ {
		var err error
		if len(w.live) == 0 || (len(w.live) < w.o.MaxLive && w.rng.IntN(100) < 60) {
			err = w.malloc(uint64(i))
		} else {
			err = w.free(w.rng.IntN(len(w.live)))
		}
		if err == nil && i%w.o.VerifyEvery == w.o.VerifyEvery-1 {
			err = w.verifyAll()
		}
		if err != nil {
			return w.res, fmt.Errorf("op %d: %w", i, err)
		}
	}
	if err := w.verifyAll(); err != nil {
		return w.res, err
	}
	for len(w.live) > 0 {
		if err := w.free(len(w.live) - 1); err != nil {
			return w.res, err
		}
	}
	return w.res, nil
}

// size draws a request size, log-uniform in [1, MaxSize].
func (w *worker) size() uint64 {
	bits := w.rng.IntN(64 - lz(w.o.MaxSize))
	n := uint64(1)<<bits + w.rng.Uint64N(uint64(1)<<bits)
	return min(n, w.o.MaxSize)
}

func lz(x uint64) int {
	n := 0
	for x&(1<<63) == 0 && n < 64 {
		x <<= 1
		n++
	}
	return n
}

func (w *worker) malloc(i uint64) error {
	n := w.size()
	p, err := w.a.Malloc(n, w.s)
	if err != nil {
		var oom *allocator.OutOfMemoryError
		if errors.As(err, &oom) {
			w.res.OOMs++
			return nil
		}
		return fmt.Errorf("Malloc(%d): %w", n, err)
	}
	b := block{ptr: p, size: n, tag: w.tagBase | i}
	if err := w.all.add(b); err != nil {
		return err
	}
	for _, pc := range pieces(b) {
		if err := w.c.CopyHtoD(p+uintptr(pc.off), w.pattern(b, pc), w.s); err != nil {
			return fmt.Errorf("writing block %#x+%d: %w", p, n, err)
		}
	}
	w.live = append(w.live, b)
	w.res.Mallocs++
	return nil
}

func (w *worker) free(i int) error {
	b := w.live[i]
	if err := w.verify(b); err != nil {
		return err
	}
	w.all.remove(b)
	if err := w.a.Free(b.ptr); err != nil {
		return fmt.Errorf("Free(%#x): %w", b.ptr, err)
	}
	w.live[i] = w.live[len(w.live)-1]
	w.live = w.live[:len(w.live)-1]
	w.res.Frees++
	return nil
}

func (w *worker) verifyAll() error {
	for _, b := range w.live {
		if err := w.verify(b); err != nil {
			return err
		}
	}
	return nil
}

func (w *worker) verify(b block) error {
	for _, pc := range pieces(b) {
		want := w.pattern(b, pc)
		got := make([]byte, len(want))
		if err := w.c.CopyDtoH(got, b.ptr+uintptr(pc.off), w.s); err != nil {
			return fmt.Errorf("reading block %#x+%d: %w", b.ptr, b.size, err)
		}
		for j := range got {
			if got[j] != want[j] {
				return fmt.Errorf("block %#x+%d (tag %#x) corrupted at byte %d: %#x, want %#x",
					b.ptr, b.size, b.tag, pc.off+uint64(j), got[j], want[j])
			}
		}
		w.res.Verified += int64(len(got))
	}
	return nil
}

// piece is a part of a block that carries the pattern.
type piece struct{ off, n uint64 }

// pieces lists the parts of b that carry its pattern.
func pieces(b block) []piece {
	if b.size <= FullPattern {
		return []piece{{0, b.size}}
	}
	mid := (b.tag * 0x9e3779b97f4a7c15 % (b.size - 2*window)) &^ 7
	return []piece{{0, window}, {mid, window}, {b.size - window, window}}
}

// pattern returns the bytes of b's pattern over pc: 8-byte words derived
// from the tag and the word's offset in the block.
func (w *worker) pattern(b block, pc piece) []byte {
	out := make([]byte, pc.n)
	var word [8]byte
	for j := uint64(0); j < pc.n; j++ {
		off := pc.off + j
		if j == 0 || off%8 == 0 {
			binary.LittleEndian.PutUint64(word[:], b.tag*0xbf58476d1ce4e5b9^(off/8+1)*0x94d049bb133111eb)
		}
		out[j] = word[off%8]
	}
	return out
}
