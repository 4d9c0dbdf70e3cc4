//go:build unix

package cuda

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ebitengine/purego"

	"github.com/vmmalloc/vmmalloc/backend"
)

// sym indexes the symbol table. Every symbol is resolved when the library is
// loaded, so a missing one fails Open, never a later call.
type sym int

const (
	symInit sym = iota
	symDeviceGetCount
	symDeviceGet
	symDeviceGetAttribute
	symPrimaryCtxRetain
	symPrimaryCtxRelease
	symCtxSetCurrent
	symCtxSynchronize
	symMemGetInfo
	symMemGetAllocationGranularity
	symMemAddressReserve
	symMemAddressFree
	symMemCreate
	symMemRelease
	symMemMap
	symMemUnmap
	symMemSetAccess
	symMemGetAccess
	symMemGetAddressRange
	symMemRetainAllocationHandle
	symMemGetAllocationPropertiesFromHandle
	symMemExportToShareableHandle
	symMemImportFromShareableHandle
	symStreamCreate
	symStreamDestroy
	symStreamSynchronize
	symStreamGetCtx
	symEventCreate
	symEventRecord
	symEventQuery
	symEventSynchronize
	symEventDestroy
	symMemHostAlloc
	symMemFreeHost
	symMemHostRegister
	symMemHostUnregister
	symMemHostGetDevicePointer
	symMemcpyHtoDAsync
	symMemcpyDtoHAsync
	symMemcpyDtoDAsync
	symMemsetD8Async
	numSyms
)

// symNames are the exported names. Several API names are #defined to _v2
// exports in cuda.h; the plain export keeps the old (32-bit size) ABI, so
// the _v2 name is the one to resolve.
var symNames = [numSyms]string{
	symInit:                                 "cuInit",
	symDeviceGetCount:                       "cuDeviceGetCount",
	symDeviceGet:                            "cuDeviceGet",
	symDeviceGetAttribute:                   "cuDeviceGetAttribute",
	symPrimaryCtxRetain:                     "cuDevicePrimaryCtxRetain",
	symPrimaryCtxRelease:                    "cuDevicePrimaryCtxRelease_v2",
	symCtxSetCurrent:                        "cuCtxSetCurrent",
	symCtxSynchronize:                       "cuCtxSynchronize",
	symMemGetInfo:                           "cuMemGetInfo_v2",
	symMemGetAllocationGranularity:          "cuMemGetAllocationGranularity",
	symMemAddressReserve:                    "cuMemAddressReserve",
	symMemAddressFree:                       "cuMemAddressFree",
	symMemCreate:                            "cuMemCreate",
	symMemRelease:                           "cuMemRelease",
	symMemMap:                               "cuMemMap",
	symMemUnmap:                             "cuMemUnmap",
	symMemSetAccess:                         "cuMemSetAccess",
	symMemGetAccess:                         "cuMemGetAccess",
	symMemGetAddressRange:                   "cuMemGetAddressRange_v2",
	symMemRetainAllocationHandle:            "cuMemRetainAllocationHandle",
	symMemGetAllocationPropertiesFromHandle: "cuMemGetAllocationPropertiesFromHandle",
	symMemExportToShareableHandle:           "cuMemExportToShareableHandle",
	symMemImportFromShareableHandle:         "cuMemImportFromShareableHandle",
	symStreamCreate:                         "cuStreamCreate",
	symStreamDestroy:                        "cuStreamDestroy_v2",
	symStreamSynchronize:                    "cuStreamSynchronize",
	symStreamGetCtx:                         "cuStreamGetCtx",
	symEventCreate:                          "cuEventCreate",
	symEventRecord:                          "cuEventRecord",
	symEventQuery:                           "cuEventQuery",
	symEventSynchronize:                     "cuEventSynchronize",
	symEventDestroy:                         "cuEventDestroy_v2",
	symMemHostAlloc:                         "cuMemHostAlloc",
	symMemFreeHost:                          "cuMemFreeHost",
	symMemHostRegister:                      "cuMemHostRegister_v2",
	symMemHostUnregister:                    "cuMemHostUnregister",
	symMemHostGetDevicePointer:              "cuMemHostGetDevicePointer_v2",
	symMemcpyHtoDAsync:                      "cuMemcpyHtoDAsync_v2",
	symMemcpyDtoHAsync:                      "cuMemcpyDtoHAsync_v2",
	symMemcpyDtoDAsync:                      "cuMemcpyDtoDAsync_v2",
	symMemsetD8Async:                        "cuMemsetD8Async",
}

// lib is a loaded driver library and its resolved entry points. It is
// immutable once loaded and shared by every Driver opened on the same path.
type lib struct {
	path string
	h    uintptr          // dlopen handle; never closed (drivers must not be unloaded)
	fn   [numSyms]uintptr // entry points, all non-zero
}

var (
	libsMu sync.Mutex
	libs   = map[string]*lib{} // guarded by libsMu; by path as given
)

// ErrNoLibrary is wrapped by the error Open returns when the driver library
// cannot be loaded or lacks a symbol. It wraps backend.ErrUnavailable.
var ErrNoLibrary = fmt.Errorf("CUDA driver library unavailable: %w", backend.ErrUnavailable)

// loadLib dlopens path once per process and resolves every symbol.
func loadLib(path string) (*lib, error) {
	libsMu.Lock()
	defer libsMu.Unlock()
	if l := libs[path]; l != nil {
		return l, nil
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		why := ""
		if msg := err.Error(); msg != "" {
			why = " (" + msg + ")"
		}
		return nil, fmt.Errorf("cuda: %s not found: install the NVIDIA driver, or use the emulated backend%s: %w", path, why, ErrNoLibrary)
	}
	l := &lib{path: path, h: h}
	var missing []string
	for i, name := range symNames {
		p, err := purego.Dlsym(h, name)
		if err != nil || p == 0 {
			missing = append(missing, name)
			continue
		}
		l.fn[i] = p
	}
	if len(missing) > 0 {
		// Leave the library loaded: unloading a driver is not supported, and
		// purego.Dlclose on a half-used handle gains nothing.
		return nil, fmt.Errorf("cuda: %s lacks %s: the NVIDIA driver is too old for virtual memory management (CUDA 11.2 or newer needed), or the file is not libcuda: %w",
			path, strings.Join(missing, ", "), ErrNoLibrary)
	}
	libs[path] = l
	return l, nil
}

// call calls entry point s. The uintptrescapes directive keeps every Go
// pointer converted to uintptr in the argument list alive (and off the
// moving stack) until the call returns, as for purego.SyscallN itself.
//
//go:uintptrescapes
func (l *lib) call(s sym, args ...uintptr) cuResult {
	r, _, _ := purego.SyscallN(l.fn[s], args...)
	return cuResult(int32(r))
}

// errClosed is returned by every call on a closed Driver.
var errClosed = errors.New("driver is closed")
