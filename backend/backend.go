// Package backend defines the driver interface vmmalloc allocates through:
// the virtual-memory-management (VMM) primitives of an accelerator driver,
// plus the streams and events that order work on a device.
//
// The interface mirrors the Ascend CANN runtime's VMM API (the seed
// documents) and maps one-to-one onto the CUDA driver's VMM API, so that a
// backend for either is a thin translation:
//
//	backend.Driver          Ascend ACL                              CUDA driver
//	--------------------    ------------------------------------    ------------------------------------
//	Granularity             aclrtMemGetAllocationGranularity        cuMemGetAllocationGranularity
//	ReserveAddress          aclrtReserveMemAddress                  cuMemAddressReserve
//	ReleaseAddress          aclrtReleaseMemAddress(ptr)             cuMemAddressFree(ptr, size)
//	CreatePhysical          aclrtMallocPhysical                     cuMemCreate
//	FreePhysical            aclrtFreePhysical                       cuMemRelease
//	Map                     aclrtMapMem(ptr, size, 0, h, 0)         cuMemMap(ptr, size, 0, h, 0)
//	Unmap                   aclrtUnmapMem(ptr)                      cuMemUnmap(ptr, size)
//	SetAccess               aclrtMemSetAccess                       cuMemSetAccess
//	GetAccess               aclrtMemGetAccess                       cuMemGetAccess
//	AddressRange            aclrtMemGetAddressRange                 cuMemGetAddressRange
//	RetainHandle            aclrtMemRetainAllocationHandle          cuMemRetainAllocationHandle
//	HandleProperties        aclrtMemGetAllocationPropertiesFromHandle cuMemGetAllocationPropertiesFromHandle
//	MemGetInfo              aclrtGetMemInfo                         cuMemGetInfo (per context)
//	StreamCreate/Destroy    aclrtCreateStream / aclrtDestroyStream  cuStreamCreate / cuStreamDestroy
//	StreamSynchronize       aclrtSynchronizeStream                  cuStreamSynchronize
//	EventCreate/Destroy     aclrtCreateEventWithFlag / aclrtDestroyEvent  cuEventCreate / cuEventDestroy
//	EventRecord             aclrtRecordEvent                        cuEventRecord
//	EventQuery              aclrtQueryEventStatus                   cuEventQuery
//	EventSynchronize        aclrtSynchronizeEvent                   cuEventSynchronize
//	IPC.Export              aclrtMemExportToShareableHandle         cuMemExportToShareableHandle
//	IPC.SetPids             aclrtMemSetPidToShareableHandle         (none: POSIX fd passing)
//	IPC.Import              aclrtMemImportFromShareableHandle       cuMemImportFromShareableHandle
//	HostMemory.MallocHost   aclrtMallocHost                         cuMemHostAlloc
//	HostMemory.FreeHost     aclrtFreeHost                           cuMemFreeHost
//	HostMemory.HostRegister aclrtHostRegister                       cuMemHostRegister
//	Copier.CopyHtoD/DtoH/DtoD aclrtMemcpyAsync                      cuMemcpyHtoDAsync_v2 / DtoH / DtoD
//	Copier.Memset           aclrtMemsetAsync                        cuMemsetD8Async
//	DeviceSynchronizer      aclrtSynchronizeDevice                  cuCtxSynchronize
//
// Where the two drivers differ the interface takes the stricter rule of
// both: Unmap and ReleaseAddress take the size too (CUDA needs it, ACL
// checks it), a map always covers a whole handle at offset 0 (ACL requires
// it), and a device is named explicitly on every call that needs one
// (ACL's aclrtSetDevice and CUDA's current context are the binding's job).
//
// Driver is the mandatory interface. Capabilities only some drivers have
// are separate interfaces (IPC, HostMemory, Copier, DeviceSynchronizer,
// Introspector) discovered by type assertion,
// the Go idiom of io.WriterTo:
//
//	if ipc, ok := drv.(backend.IPC); ok { ... }
//
// Every error a backend returns is a *Error that wraps one of the sentinel
// kinds (ErrOutOfMemory, ErrInvalidArgument, ErrNotSupported,
// ErrNotPermitted, ErrUnavailable), so callers test it with errors.Is and
// read the primitive, driver code and violated rule with errors.As.
package backend

import (
	"errors"
	"fmt"
)

// Handle is an opaque physical memory handle (aclrtDrvMemHandle,
// CUmemGenericAllocationHandle). Zero is never a valid handle.
type Handle uint64

// Stream is an opaque stream identifier. Zero is never a valid stream
// returned by StreamCreate; allocators use it for "the default stream" only
// when a backend says so.
type Stream uint64

// Event is an opaque event identifier. Zero is never a valid event.
type Event uint64

// LocationType says where physical memory lives (aclrtMemLocationType).
type LocationType int

const (
	LocationDevice LocationType = iota // device memory (HBM)
	LocationHost                       // host memory (DDR)
)

func (t LocationType) String() string {
	switch t {
	case LocationDevice:
		return "device"
	case LocationHost:
		return "host"
	}
	return fmt.Sprintf("LocationType(%d)", int(t))
}

// Location names one device or the host (aclrtMemLocation, CUmemLocation).
type Location struct {
	Type LocationType
	ID   int // device ordinal, or NUMA node for the host
}

// PageAttr is the page size of physical memory (aclrtMemAttr's
// NORMAL / HUGE / HUGE1G family).
type PageAttr int

const (
	PageNormal PageAttr = iota // normal pages
	PageHuge                   // 2 MiB huge pages
	PageHuge1G                 // 1 GiB huge pages, device only
)

func (a PageAttr) String() string {
	switch a {
	case PageNormal:
		return "normal"
	case PageHuge:
		return "huge"
	case PageHuge1G:
		return "huge1g"
	}
	return fmt.Sprintf("PageAttr(%d)", int(a))
}

// PhysicalProp describes physical memory to create (aclrtPhysicalMemProp,
// CUmemAllocationProp). The allocation type is always pinned.
type PhysicalProp struct {
	Location Location
	Attr     PageAttr
}

// DeviceProp is the usual property: huge pages on device dev.
func DeviceProp(dev int) PhysicalProp {
	return PhysicalProp{Location: Location{Type: LocationDevice, ID: dev}, Attr: PageHuge}
}

// GranularityOption selects MINIMUM or RECOMMENDED granularity.
type GranularityOption int

const (
	GranularityMinimum GranularityOption = iota
	GranularityRecommended
)

// AccessFlags is the protection of a mapped range for one location.
type AccessFlags int

const (
	AccessNone      AccessFlags = 0
	AccessRead      AccessFlags = 1
	AccessReadWrite AccessFlags = 3
)

// AccessDesc grants Flags on a mapped range to Location.
type AccessDesc struct {
	Location Location
	Flags    AccessFlags
}

// Driver is the VMM and stream interface every backend implements. All
// methods are safe for concurrent use. Sizes are in bytes.
type Driver interface {
	// Name identifies the backend ("emulated", "cuda", "acl").
	Name() string
	// DeviceCount is the number of devices, numbered 0..DeviceCount()-1.
	DeviceCount() int
	// MemGetInfo reports free and total device memory in bytes.
	MemGetInfo(dev int) (free, total uint64, err error)

	// Granularity is the allocation granularity for prop.
	Granularity(prop PhysicalProp, opt GranularityOption) (uint64, error)
	// ReserveAddress reserves size bytes of virtual address space. The
	// system chooses the address.
	ReserveAddress(size uint64) (uintptr, error)
	// ReleaseAddress frees a reservation made by ReserveAddress. Every
	// mapping in it must have been unmapped.
	ReleaseAddress(va uintptr, size uint64) error
	// CreatePhysical creates size bytes of physical memory; size must be a
	// multiple of the granularity.
	CreatePhysical(size uint64, prop PhysicalProp) (Handle, error)
	// FreePhysical releases a handle. If the handle is still mapped the
	// memory is released only when its last mapping is unmapped.
	FreePhysical(h Handle) error
	// Map maps the whole of h at va, which must lie inside a reservation.
	// The mapping is inaccessible until SetAccess.
	Map(va uintptr, size uint64, h Handle) error
	// Unmap removes the mapping that starts at va; size must be its size.
	Unmap(va uintptr, size uint64) error
	// SetAccess sets protection on exactly one mapped range.
	SetAccess(va uintptr, size uint64, desc []AccessDesc) error
	// GetAccess reads the protection of the mapping containing va.
	GetAccess(va uintptr, loc Location) (AccessFlags, error)
	// AddressRange returns the base and size of the mapping containing va.
	AddressRange(va uintptr) (base uintptr, size uint64, err error)
	// RetainHandle returns the handle mapped at va and takes a reference
	// that needs its own FreePhysical.
	RetainHandle(va uintptr) (Handle, error)
	// HandleProperties returns the properties and size of h.
	HandleProperties(h Handle) (PhysicalProp, uint64, error)

	// StreamCreate creates a stream on dev.
	StreamCreate(dev int) (Stream, error)
	// StreamDestroy destroys a stream.
	StreamDestroy(s Stream) error
	// StreamSynchronize waits until all work queued on s has completed.
	StreamSynchronize(s Stream) error
	// StreamDevice reports the device a stream belongs to.
	StreamDevice(s Stream) (int, error)
	// EventCreate creates an event on dev.
	EventCreate(dev int) (Event, error)
	// EventDestroy destroys an event.
	EventDestroy(e Event) error
	// EventRecord captures the work queued on s so far into e.
	EventRecord(e Event, s Stream) error
	// EventQuery reports whether the work captured by e has completed.
	EventQuery(e Event) (bool, error)
	// EventSynchronize waits until the work captured by e has completed.
	EventSynchronize(e Event) error
}

// ShareFlags controls export (ACL_RT_VMM_EXPORT_FLAG_*).
type ShareFlags uint64

const (
	ShareDefault              ShareFlags = 0 // importer pids are checked against the whitelist
	ShareDisablePidValidation ShareFlags = 1 // any process may import
)

// IPC is the optional capability of sharing physical memory with other
// processes.
type IPC interface {
	// Export makes a shareable handle for h. Handle and shareable handle
	// are 1:1: exporting the same handle twice is an error.
	Export(h Handle, flags ShareFlags) (uint64, error)
	// SetPids whitelists the processes allowed to import shareable.
	SetPids(shareable uint64, pids []int32) error
	// Import opens a shareable handle exported by another process as a
	// local handle on dev.
	Import(shareable uint64, dev int) (Handle, error)
	// Pid is the identifier of the calling process as the driver knows it
	// (aclrtDeviceGetBareTgid).
	Pid() int32
}

// HostMemory is the optional capability of pinned and registered host
// memory.
type HostMemory interface {
	// MallocHost allocates size bytes of pinned host memory, 64-byte
	// aligned at least, not initialised.
	MallocHost(size uint64) (uintptr, error)
	// FreeHost frees pinned host memory at once, without waiting for device
	// work that uses it.
	FreeHost(p uintptr) error
	// FreeHostWithDevSync frees pinned host memory after device work that
	// uses it has completed.
	FreeHostWithDevSync(p uintptr) error
	// HostRegister pins an existing 4 KiB-aligned host range and maps it for
	// the device.
	HostRegister(p uintptr, size uint64, flags HostRegisterFlags) error
	// HostGetDevicePointer returns the device address of registered memory.
	HostGetDevicePointer(p uintptr) (uintptr, error)
	// HostUnregister undoes HostRegister.
	HostUnregister(p uintptr) error
}

// Copier is the optional capability of moving bytes to, from and within
// device memory, and of filling it: the few data primitives that prove a
// mapping really holds memory (integrity tests) and that a framework needs
// first. CUDA: cuMemcpyHtoDAsync_v2 / cuMemcpyDtoHAsync_v2 /
// cuMemcpyDtoDAsync_v2 / cuMemsetD8Async; ACL: aclrtMemcpyAsync /
// aclrtMemsetAsync.
//
// The host side is Go memory, which the driver must not touch after the call
// returns, so CopyHtoD and CopyDtoH are ordered on s after the work already
// queued there and return only once the copy has completed. CopyDtoD and
// Memset are queued on s and return at once.
type Copier interface {
	// CopyHtoD copies len(src) bytes from host memory to device address dst.
	CopyHtoD(dst uintptr, src []byte, s Stream) error
	// CopyDtoH copies len(dst) bytes from device address src to host memory.
	CopyDtoH(dst []byte, src uintptr, s Stream) error
	// CopyDtoD copies n bytes between device addresses.
	CopyDtoD(dst, src uintptr, n uint64, s Stream) error
	// Memset sets n bytes at device address dst to value.
	Memset(dst uintptr, value byte, n uint64, s Stream) error
}

// DeviceSynchronizer is the optional capability of waiting for all work on
// every stream of a device (cuCtxSynchronize, aclrtSynchronizeDevice). An
// allocator uses it when it must release memory whose stream it can no longer
// name (destroyed behind its back).
type DeviceSynchronizer interface {
	// DeviceSynchronize waits until all work queued on dev has completed.
	DeviceSynchronize(dev int) error
}

// Range is a span of device address space.
type Range struct {
	Addr uintptr
	Size uint64 // nbytes
}

// Introspector is the optional capability of listing what the driver holds
// for the calling process, so that an allocator's invariant checker can
// compare its own view with the driver's.
type Introspector interface {
	// LiveRanges returns, in ascending address order, every address
	// reservation and the mappings of device dev, and the number of live
	// physical handles on device dev.
	LiveRanges(dev int) (reservations, mappings []Range, handles int)
}

// HostRegisterFlags are the flags of HostRegister (aclrtHostRegisterType).
type HostRegisterFlags uint32

const (
	HostRegisterMapped   HostRegisterFlags = 0 // map for device access
	HostRegisterPinned   HostRegisterFlags = 1 // pin only
	HostRegisterIOMemory HostRegisterFlags = 2 // reserved, unsupported
	HostRegisterReadOnly HostRegisterFlags = 4 // reserved, unsupported
)

// Op names a driver primitive, for error reports, call counts and fault
// injection.
type Op int

const (
	OpGranularity Op = iota
	OpReserve
	OpRelease
	OpCreate
	OpFree
	OpMap
	OpUnmap
	OpSetAccess
	OpGetAccess
	OpAddressRange
	OpRetain
	OpHandleProps
	OpMemGetInfo
	OpStreamCreate
	OpStreamDestroy
	OpStreamSync
	OpEventCreate
	OpEventDestroy
	OpEventRecord
	OpEventQuery
	OpEventSync
	OpExport
	OpSetPids
	OpImport
	OpMallocHost
	OpFreeHost
	OpHostRegister
	OpHostUnregister
	OpHostDevicePointer
	OpMemcpy
	OpMemset
	OpDeviceSync
	NumOps // number of primitives; not an Op
)

var opNames = [NumOps]string{
	OpGranularity:       "MemGetAllocationGranularity",
	OpReserve:           "ReserveMemAddress",
	OpRelease:           "ReleaseMemAddress",
	OpCreate:            "MallocPhysical",
	OpFree:              "FreePhysical",
	OpMap:               "MapMem",
	OpUnmap:             "UnmapMem",
	OpSetAccess:         "MemSetAccess",
	OpGetAccess:         "MemGetAccess",
	OpAddressRange:      "MemGetAddressRange",
	OpRetain:            "MemRetainAllocationHandle",
	OpHandleProps:       "MemGetAllocationPropertiesFromHandle",
	OpMemGetInfo:        "GetMemInfo",
	OpStreamCreate:      "CreateStream",
	OpStreamDestroy:     "DestroyStream",
	OpStreamSync:        "SynchronizeStream",
	OpEventCreate:       "CreateEvent",
	OpEventDestroy:      "DestroyEvent",
	OpEventRecord:       "RecordEvent",
	OpEventQuery:        "QueryEventStatus",
	OpEventSync:         "SynchronizeEvent",
	OpExport:            "MemExportToShareableHandle",
	OpSetPids:           "MemSetPidToShareableHandle",
	OpImport:            "MemImportFromShareableHandle",
	OpMallocHost:        "MallocHost",
	OpFreeHost:          "FreeHost",
	OpHostRegister:      "HostRegister",
	OpHostUnregister:    "HostUnregister",
	OpHostDevicePointer: "HostGetDevicePointer",
	OpMemcpy:            "MemcpyAsync",
	OpMemset:            "MemsetAsync",
	OpDeviceSync:        "SynchronizeDevice",
}

func (op Op) String() string {
	if op >= 0 && op < NumOps {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// Sentinel error kinds. Every *Error wraps exactly one of them.
var (
	ErrOutOfMemory     = errors.New("out of memory")
	ErrInvalidArgument = errors.New("invalid argument")
	ErrNotSupported    = errors.New("not supported")
	ErrNotPermitted    = errors.New("not permitted")
	ErrUnavailable     = errors.New("unavailable")
)

// Error is a failed driver call.
type Error struct {
	Op   Op     // the primitive that failed
	Kind error  // one of the sentinel kinds
	Code int    // the driver's own code (aclError, CUresult); 0 if none
	Rule string // the seed rule violated, e.g. "R6", if any
	Msg  string // what was wrong, for people
}

func (e *Error) Error() string {
	s := e.Op.String() + ": " + e.Kind.Error()
	if e.Rule != "" {
		s += " [" + e.Rule + "]"
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Code != 0 {
		s += fmt.Sprintf(" (code %d)", e.Code)
	}
	return s
}

// Unwrap returns the error's kind, so errors.Is(err, ErrOutOfMemory) works.
func (e *Error) Unwrap() error { return e.Kind }

// Errorf builds an *Error.
func Errorf(op Op, kind error, rule string, format string, args ...any) *Error {
	return &Error{Op: op, Kind: kind, Rule: rule, Msg: fmt.Sprintf(format, args...)}
}
