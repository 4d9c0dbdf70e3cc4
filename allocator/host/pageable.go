package host

import (
	"errors"
	"fmt"
	"unsafe"
)

// MallocOptions are the choices of MallocWith.
type MallocOptions struct {
	// AllowPageable lets a request that cannot be pinned, because the pin
	// budget refuses it or the driver is out of pinned memory even after
	// the out-of-memory ladder, be served with pageable memory from the
	// operating system instead of failing (Allocation.Pinned false). Such
	// memory has no device address, copies from it run at pageable speed,
	// and Free gives it straight back.
	AllowPageable bool
}

// Allocation is what MallocWith returns.
type Allocation struct {
	Ptr    uintptr // host address, 4 KiB aligned
	Size   uint64  // nbytes asked for
	Pinned bool    // false: pageable fallback (MallocOptions.AllowPageable)
}

// MallocWith is Malloc with options: see MallocOptions. Without
// AllowPageable it is Malloc.
func (a *Allocator) MallocWith(size uint64, o MallocOptions) (Allocation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := a.malloc(size)
	if err == nil {
		return Allocation{Ptr: b.ptr, Size: size, Pinned: true}, nil
	}
	if !o.AllowPageable || !outOfMemory(err) || a.closed {
		return Allocation{}, err
	}
	n := roundPage(size)
	mem, merr := mapAnonymous(n)
	if merr != nil {
		return Allocation{}, errors.Join(err, fmt.Errorf("pageable fallback of %d bytes: %w", n, merr))
	}
	b = &block{ptr: uintptr(unsafe.Pointer(unsafe.SliceData(mem))), size: n, class: -1, req: size, state: stateAllocated, mem: mem, pageable: true}
	a.blocks[b.ptr] = b
	a.spans.ReplaceOrInsert(span{start: b.ptr, end: b.ptr + uintptr(n), b: b})
	a.st.Pageable.Add(1)
	a.st.PageableBytes.Add(int64(n))
	a.st.NumPageableFallbacks++
	a.st.NumOOMs-- // the ladder counted a failure the fallback served
	return Allocation{Ptr: b.ptr, Size: size, Pinned: false}, nil
}

// freePageable gives a pageable block straight back: pageable memory is
// copied through the driver's own staging, so no stream work reads it
// after the copy call returns. mu held.
func (a *Allocator) freePageable(b *block) error {
	clear(b.uses)
	b.uses = b.uses[:0]
	a.releasePageable(b)
	return nil
}

// releasePageable unmaps pageable block b and drops it. mu held.
func (a *Allocator) releasePageable(b *block) {
	_ = unmapAnonymous(b.mem) // our own mapping: cannot fail
	delete(a.blocks, b.ptr)
	a.spans.Delete(span{start: b.ptr})
	a.st.Pageable.Add(-1)
	a.st.PageableBytes.Add(-int64(b.size))
	b.mem, b.state = nil, 0
}
