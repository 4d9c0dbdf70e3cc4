package emulated

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// backing realises the model's memory operations: the accounting backing
// only hands out addresses, the real one (WithRealMemory) maps memory. The
// world's lock guards every call. An error is a *backingError.
type backing interface {
	// reserve finds extent bytes of address space aligned to align.
	reserve(extent, align uint64) (uint64, error)
	// reserveAt reserves [va, va+extent); kindOccupied if taken.
	reserveAt(va, extent uint64) error
	// release gives back a reservation.
	release(va, extent uint64) error
	// create makes size bytes of physical memory; the id is passed to
	// mapMem and free (-1 when there is nothing to keep).
	create(size uint64) (int, error)
	// free destroys physical memory made by create. Mappings of it stay
	// valid until unmapped, so there is nothing to undo on failure and
	// failures (only close(2) can fail) are ignored.
	free(id int)
	// mapMem maps physical memory id at va, inaccessible.
	mapMem(va, size uint64, id int) error
	// unmap makes [va, va+size) reserved-but-unmapped again.
	unmap(va, size uint64) error
	// protect sets the host protection of a mapping.
	protect(va, size uint64, flags backend.AccessFlags) error
	// mallocHost allocates extent bytes of host memory, hostAlign aligned.
	mallocHost(extent uint64) (uint64, error)
	// freeHost frees host memory from mallocHost.
	freeHost(p, extent uint64) error
	// bytes returns the memory at [va, va+size), or nil if not real.
	bytes(va, size uint64) []byte
	// pageSize is the host page size the backing rounds host memory to.
	pageSize() uint64
}

// backingError is a failure of the backing with its sentinel kind.
type backingError struct {
	kind error
	msg  string
}

func (e *backingError) Error() string { return e.msg }

// errOccupied is the reserveAt failure for a taken range.
var errOccupied = &backingError{backend.ErrInvalidArgument, "address range already occupied"}

func backingErrorf(kind error, format string, args ...any) *backingError {
	return &backingError{kind, fmt.Sprintf(format, args...)}
}

// accounting is the default backing: deterministic addresses, no memory.
type accounting struct {
	va   *vaSpace // reservations, [vaBase, vaBase+vaSize)
	host *vaSpace // MallocHost, [hostBase, hostLimit)
}

func newAccounting(cfg *config) *accounting {
	return &accounting{
		va:   newVASpace(vaBase, vaBase+cfg.vaSize),
		host: newVASpace(hostBase, hostLimit),
	}
}

func (a *accounting) reserve(extent, align uint64) (uint64, error) {
	va, ok := a.va.alloc(extent, align)
	if !ok {
		return 0, backingErrorf(backend.ErrOutOfMemory, "virtual address space exhausted (%d bytes wanted)", extent)
	}
	return va, nil
}

func (a *accounting) reserveAt(va, extent uint64) error {
	if !a.va.allocAt(va, extent) {
		return errOccupied
	}
	return nil
}

func (a *accounting) release(va, extent uint64) error {
	a.va.release(va, extent)
	return nil
}

func (a *accounting) create(uint64) (int, error)                        { return -1, nil }
func (a *accounting) free(int)                                          {}
func (a *accounting) mapMem(uint64, uint64, int) error                  { return nil }
func (a *accounting) unmap(uint64, uint64) error                        { return nil }
func (a *accounting) protect(uint64, uint64, backend.AccessFlags) error { return nil }
func (a *accounting) bytes(uint64, uint64) []byte                       { return nil }
func (a *accounting) pageSize() uint64                                  { return hostAlign }

func (a *accounting) mallocHost(extent uint64) (uint64, error) {
	p, ok := a.host.alloc(extent, hostAlign)
	if !ok {
		return 0, backingErrorf(backend.ErrOutOfMemory, "host address window exhausted")
	}
	return p, nil
}

func (a *accounting) freeHost(p, extent uint64) error {
	a.host.release(p, extent)
	return nil
}
