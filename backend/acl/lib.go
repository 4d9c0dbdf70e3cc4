package acl

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/ebitengine/purego"
	"github.com/vmmalloc/vmmalloc/backend"
)

// DefaultLibrary is the file name dlopen searches for (LD_LIBRARY_PATH, the
// ld.so cache), as installed by the CANN toolkit in
// ${ASCEND_TOOLKIT_HOME}/lib64.
const DefaultLibrary = "libascendcl.so"

// EnvLibrary overrides DefaultLibrary when WithLibrary is not given.
const EnvLibrary = "VMMALLOC_LIBASCENDCL"

// library is a loaded libascendcl.so: the address of every symbol the
// binding calls, all resolved at Open. Immutable after load.
type library struct {
	path string
	dl   uintptr // dlopen handle; never closed (see Close)

	aclInit              uintptr
	getDeviceCount       uintptr
	setDevice            uintptr
	getCurrentContext    uintptr
	setCurrentContext    uintptr
	deviceGetBareTgid    uintptr
	getMemInfo           uintptr
	granularity          uintptr
	reserve              uintptr
	release              uintptr
	mallocPhysical       uintptr
	freePhysical         uintptr
	mapMem               uintptr
	unmapMem             uintptr
	setAccess            uintptr
	getAccess            uintptr
	addressRange         uintptr
	retain               uintptr
	propsFromHandle      uintptr
	export               uintptr
	setPids              uintptr
	importShareable      uintptr
	createStream         uintptr
	destroyStream        uintptr
	synchronizeStream    uintptr
	synchronizeDevice    uintptr
	createEventWithFlag  uintptr
	destroyEvent         uintptr
	recordEvent          uintptr
	queryEventStatus     uintptr
	synchronizeEvent     uintptr
	memcpyAsync          uintptr
	memsetAsync          uintptr
	mallocHost           uintptr
	freeHost             uintptr
	freeHostWithDevSync  uintptr
	hostRegister         uintptr
	hostGetDevicePointer uintptr
	hostUnregister       uintptr
}

// symbols lists every export the binding needs with the field it fills.
func (l *library) symbols() []struct {
	name string
	fn   *uintptr
} {
	return []struct {
		name string
		fn   *uintptr
	}{
		{"aclInit", &l.aclInit},
		{"aclrtGetDeviceCount", &l.getDeviceCount},
		{"aclrtSetDevice", &l.setDevice},
		{"aclrtGetCurrentContext", &l.getCurrentContext},
		{"aclrtSetCurrentContext", &l.setCurrentContext},
		{"aclrtDeviceGetBareTgid", &l.deviceGetBareTgid},
		{"aclrtGetMemInfo", &l.getMemInfo},
		{"aclrtMemGetAllocationGranularity", &l.granularity},
		{"aclrtReserveMemAddress", &l.reserve},
		{"aclrtReleaseMemAddress", &l.release},
		{"aclrtMallocPhysical", &l.mallocPhysical},
		{"aclrtFreePhysical", &l.freePhysical},
		{"aclrtMapMem", &l.mapMem},
		{"aclrtUnmapMem", &l.unmapMem},
		{"aclrtMemSetAccess", &l.setAccess},
		{"aclrtMemGetAccess", &l.getAccess},
		{"aclrtMemGetAddressRange", &l.addressRange},
		{"aclrtMemRetainAllocationHandle", &l.retain},
		{"aclrtMemGetAllocationPropertiesFromHandle", &l.propsFromHandle},
		{"aclrtMemExportToShareableHandle", &l.export},
		{"aclrtMemSetPidToShareableHandle", &l.setPids},
		{"aclrtMemImportFromShareableHandle", &l.importShareable},
		{"aclrtCreateStream", &l.createStream},
		{"aclrtDestroyStream", &l.destroyStream},
		{"aclrtSynchronizeStream", &l.synchronizeStream},
		{"aclrtSynchronizeDevice", &l.synchronizeDevice},
		{"aclrtCreateEventWithFlag", &l.createEventWithFlag},
		{"aclrtDestroyEvent", &l.destroyEvent},
		{"aclrtRecordEvent", &l.recordEvent},
		{"aclrtQueryEventStatus", &l.queryEventStatus},
		{"aclrtSynchronizeEvent", &l.synchronizeEvent},
		{"aclrtMemcpyAsync", &l.memcpyAsync},
		{"aclrtMemsetAsync", &l.memsetAsync},
		{"aclrtMallocHost", &l.mallocHost},
		{"aclrtFreeHost", &l.freeHost},
		{"aclrtFreeHostWithDevSync", &l.freeHostWithDevSync},
		{"aclrtHostRegister", &l.hostRegister},
		{"aclrtHostGetDevicePointer", &l.hostGetDevicePointer},
		{"aclrtHostUnregister", &l.hostUnregister},
	}
}

// ErrLibrary is wrapped by the error Open returns when the library cannot
// be loaded or lacks a symbol. It wraps backend.ErrUnavailable, as
// drivers.Open promises of a backend that cannot start.
var ErrLibrary = fmt.Errorf("acl: cannot load the ACL runtime: %w", backend.ErrUnavailable)

// load dlopens path and resolves every symbol, reporting all missing ones
// in one error.
func load(path string) (*library, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: %s: the ACL runtime is Linux only, use the emulated backend", ErrLibrary, path)
	}
	dl, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%w: %s not found: install the CANN toolkit, or use the emulated backend (%v)", ErrLibrary, path, err)
	}
	l := &library{path: path, dl: dl}
	var missing []string
	for _, s := range l.symbols() {
		p, err := purego.Dlsym(dl, s.name)
		if err != nil || p == 0 {
			missing = append(missing, s.name)
			continue
		}
		*s.fn = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s lacks %d symbol(s): %s; the CANN toolkit is too old or the file is not libascendcl.so",
			ErrLibrary, path, len(missing), strings.Join(missing, ", "))
	}
	return l, nil
}

// libraryPath picks the library to load: the option, then $VMMALLOC_LIBASCENDCL,
// then DefaultLibrary.
func libraryPath(opt string) string {
	if opt != "" {
		return opt
	}
	if p := os.Getenv(EnvLibrary); p != "" {
		return p
	}
	return DefaultLibrary
}
