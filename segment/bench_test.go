package segment

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/backend"
)

// BenchmarkMapUnmap maps and unmaps 8 full-size handles of a 46k-granule
// segment with handles from the cache; allocations are the fake driver's
// bookkeeping.
func BenchmarkMapUnmap(b *testing.B) {
	d := newFakeDriver()
	d.noLog = true
	prop := backend.DeviceProp(0)
	hc := NewHandleCache(d, gr, prop, 16, nil)
	s, err := New(d, Config{Prop: prop, PageSize: gr, VASize: 46080 * gr, Cache: hc})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		off := uint64(i%5000) * 8 * gr
		if err := s.Map(off, 8*gr); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Unmap(off, 8*gr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWholeHandles asks for the whole handles of a 90 GiB segment
// mapped in 20 MiB pages (4608 handles), trimmed to a 1 GiB suffix.
func BenchmarkWholeHandles(b *testing.B) {
	d := newFakeDriver()
	d.noLog = true
	s, err := New(d, Config{Prop: backend.DeviceProp(0), PageSize: 20 << 20, VASize: 90 << 30})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Map(0, s.Size()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		lo, hi := s.WholeHandles(1<<20, s.Size()-2<<20, 1<<30)
		if hi-lo < 1<<30 {
			b.Fatal(lo, hi)
		}
	}
}

// nopVMM is a driver whose Map, Unmap and SetAccess do nothing, to measure
// the segment's own allocations.
type nopVMM struct{ *fakeDriver }

func (nopVMM) Map(uintptr, uint64, backend.Handle) error             { return nil }
func (nopVMM) Unmap(uintptr, uint64) error                           { return nil }
func (nopVMM) SetAccess(uintptr, uint64, []backend.AccessDesc) error { return nil }

func TestMapUnmapAllocationFree(t *testing.T) {
	d := nopVMM{newFakeDriver()}
	d.noLog = true
	prop := backend.DeviceProp(0)
	const page = 4 * gr
	hc := NewHandleCache(d, page, prop, 16, nil)
	s, err := New(d, Config{Prop: prop, PageSize: page, VASize: 256 * page, Cache: hc})
	if err != nil {
		t.Fatal(err)
	}
	// Warm up: fill the cache and size the scratch buffer.
	if err := s.Map(0, 8*page); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Unmap(0, 8*page); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := s.Map(64*page, 8*page); err != nil {
			t.Fatal(err)
		}
		if lo, hi := s.WholeHandles(64*page+gr, 7*page, 3*page); lo != 68*page || hi != 71*page {
			t.Fatalf("WholeHandles = [%#x, %#x)", lo, hi)
		}
		if _, err := s.Unmap(64*page, 8*page); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Map+Unmap of cached handles allocates %v times", allocs)
	}
}
