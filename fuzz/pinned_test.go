//go:build linux

package fuzz

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/vmmalloc/vmmalloc/allocator/host"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// FuzzPinnedHost drives a pinned host allocator (expandable segments, or
// the size classes when the first byte is odd) under a small shared pin
// budget with the operations encoded in the input, three bytes each:
// Malloc, MallocWith(AllowPageable), Free, RecordStream, stream
// completion, EmptyCache and DevicePointer. A slow reference model holds
// what the caller holds (ranges that never overlap, their bytes intact,
// the pageable ones apart), Check runs after every operation, and the
// statistics must equal the model's recount.
func FuzzPinnedHost(f *testing.F) {
	f.Add([]byte{0, 0, 3, 0, 1, 5, 9, 2, 0, 0, 3, 0, 1, 4, 0, 5, 0, 0, 6, 0, 0})
	f.Add([]byte{1, 0, 7, 200, 1, 7, 1, 0, 0, 3, 2, 0, 6, 0, 0, 2, 1, 0})
	f.Add([]byte{0, 0, 6, 0, 0, 6, 0, 0, 6, 0, 0, 6, 0, 1, 6, 0, 2, 1, 0, 2, 0, 0, 4, 0, 0, 0, 6, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 || len(data) > 600 {
			return
		}
		conf := "expandable_segments:True"
		if data[0]&1 != 0 {
			conf = "expandable_segments:False,pinned_use_host_register:True" // real memory: the model writes it
		}
		if data[0]&2 != 0 {
			conf += ",pinned_release_on_grow:True"
		}
		data = data[1:]
		e, err := emulated.New(emulated.WithManualCompletion())
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := host.ParseConfig(conf + ",pinned_budget_mb:12")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Budget = host.NewPinBudget(0)
		a, err := host.New(e, cfg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.StreamCreate(0)
		if err != nil {
			t.Fatal(err)
		}
		type alloc struct {
			n      uint64
			v      byte
			pinned bool
		}
		live := map[uintptr]alloc{}
		var order []uintptr
		sizes := []uint64{1, 4 << 10, 5000, 64 << 10, 300 << 10, 1 << 20, 3 << 20, 5 << 20}
		for i := 0; len(data) >= 3; i++ {
			op, x, y := data[0], data[1], data[2]
			data = data[3:]
			switch op % 7 {
			case 0, 1: // Malloc, MallocWith pageable allowed
				size := sizes[int(x)%len(sizes)] + uint64(y)*97
				got, err := a.MallocWith(size, host.MallocOptions{AllowPageable: op%7 == 1})
				if err != nil {
					if !errors.Is(err, host.ErrBudget) {
						t.Fatalf("op %d: Malloc(%d): %v", i, size, err)
					}
					break
				}
				for q, l := range live {
					if got.Ptr < q+uintptr(l.n) && q < got.Ptr+uintptr(size) {
						t.Fatalf("op %d: %#x+%d overlaps live %#x+%d", i, got.Ptr, size, q, l.n)
					}
				}
				fill(got.Ptr, size, byte(i))
				live[got.Ptr] = alloc{n: size, v: byte(i), pinned: got.Pinned}
				order = append(order, got.Ptr)
			case 2, 3: // Free, after RecordStream with op 3
				if len(order) == 0 {
					break
				}
				k := int(x) % len(order)
				p := order[k]
				l := live[p]
				if !intact(p, l.n, l.v) {
					t.Fatalf("op %d: the bytes of %#x+%d changed", i, p, l.n)
				}
				if op%7 == 3 {
					if err := a.RecordStream(p, s); err != nil {
						t.Fatalf("op %d: RecordStream: %v", i, err)
					}
				}
				if err := a.Free(p); err != nil {
					t.Fatalf("op %d: Free: %v", i, err)
				}
				if err := a.Free(p); err == nil {
					t.Fatalf("op %d: a second Free of %#x succeeded", i, p)
				}
				delete(live, p)
				order = append(order[:k], order[k+1:]...)
			case 4:
				if err := e.CompleteAll(); err != nil {
					t.Fatal(err)
				}
			case 5:
				if err := a.EmptyCache(); err != nil {
					t.Fatalf("op %d: EmptyCache: %v", i, err)
				}
			case 6:
				if len(order) == 0 {
					break
				}
				p := order[int(x)%len(order)]
				_, err := a.DevicePointer(p + uintptr(y)%uintptr(live[p].n))
				if live[p].pinned != (err == nil) {
					t.Fatalf("op %d: DevicePointer of pinned=%v memory: %v", i, live[p].pinned, err)
				}
			}
			if err := a.Check(); err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
			st := a.Stats()
			var pinned, pageable, req int64
			for _, l := range live {
				if l.pinned {
					pinned++
					req += int64(l.n)
				} else {
					pageable++
				}
			}
			if st.Allocation.Current != pinned || st.RequestedBytes.Current != req || st.Pageable.Current != pageable {
				t.Fatalf("op %d: stats %d allocations of %d bytes, %d pageable; model %d, %d, %d", i,
					st.Allocation.Current, st.RequestedBytes.Current, st.Pageable.Current, pinned, req, pageable)
			}
			if st.ReservedBytes.Current > 12<<20 || st.Budget.Pinned != uint64(st.ReservedBytes.Current) {
				t.Fatalf("op %d: %d bytes pinned, budget says %d, limit 12 MiB", i, st.ReservedBytes.Current, st.Budget.Pinned)
			}
		}
		for _, p := range order {
			if err := a.Free(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.CompleteAll(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if l := e.Live(); l.HostAllocs != 0 || l.HostRegs != 0 || l.Events != 0 {
			t.Fatalf("left behind: %+v", l)
		}
		if v := e.Violations(); len(v) > 0 {
			t.Fatalf("violations: %v", v)
		}
	})
}

// mem is [p, p+n) of memory the allocator mapped, outside the Go heap.
func mem(p uintptr, n uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), p)), n)
}

func fill(p uintptr, n uint64, v byte) {
	b := mem(p, n)
	for i := uint64(0); i < n; i += 4096 {
		b[i] = v
	}
	b[n-1] = v
}

func intact(p uintptr, n uint64, v byte) bool {
	b := mem(p, n)
	for i := uint64(0); i < n; i += 4096 {
		if b[i] != v {
			return false
		}
	}
	return b[n-1] == v
}
