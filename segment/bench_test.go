package segment

import (
	"testing"

	"github.com/vmmalloc/vmmalloc/backend"
)

// BenchmarkMapUnmap maps and unmaps 8 pages of a 46k-page segment with
// handles from the cache; allocations are the fake driver's bookkeeping.
func BenchmarkMapUnmap(b *testing.B) {
	d := newFakeDriver()
	d.noLog = true
	prop := backend.DeviceProp(0)
	hc := NewHandleCache(d, ps, prop, 16, nil)
	s, err := New(d, Config{Prop: prop, PageSize: ps, VASize: 46080 * ps, Cache: hc})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		off := uint64(i%5000) * 8 * ps
		if err := s.Map(off, 8*ps); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Unmap(off, 8*ps); err != nil {
			b.Fatal(err)
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
	hc := NewHandleCache(d, ps, prop, 16, nil)
	s, err := New(d, Config{Prop: prop, PageSize: ps, VASize: 1024 * ps, Cache: hc})
	if err != nil {
		t.Fatal(err)
	}
	// Warm up: fill the cache and size the scratch buffer.
	if err := s.Map(0, 8*ps); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Unmap(0, 8*ps); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := s.Map(64*ps, 8*ps); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Unmap(64*ps, 8*ps); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Map+Unmap of cached handles allocates %v times", allocs)
	}
}
