package acl

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// aclError codes the binding names (acl_base.h, rt_error_codes.h).
const (
	codeSuccess            = 0
	codeInvalidParam       = 100000 // ACL_ERROR_INVALID_PARAM
	codeUninitialize       = 100001 // ACL_ERROR_UNINITIALIZE
	codeRepeatInitialize   = 100002 // ACL_ERROR_REPEAT_INITIALIZE
	codeBadAlloc           = 200000 // ACL_ERROR_BAD_ALLOC
	codeAPINotSupport      = 200001 // ACL_ERROR_API_NOT_SUPPORT
	codeFeatureUnsupported = 200006 // ACL_ERROR_FEATURE_UNSUPPORTED
	codeRTParamInvalid     = 107000 // ACL_ERROR_RT_PARAM_INVALID
	codeRTInvalidDeviceID  = 107001 // ACL_ERROR_RT_INVALID_DEVICEID
	codeRTContextNull      = 107002 // ACL_ERROR_RT_CONTEXT_NULL
	codeRTInvalidMemType   = 107016 // ACL_ERROR_RT_INVALID_MEMORY_TYPE
	codeRTFeatureNotSup    = 207000 // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
	codeRTMemoryAlloc      = 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION
	codeRTMemoryFree       = 207002 // ACL_ERROR_RT_MEMORY_FREE
	codeRTNoDevice         = 207004 // ACL_ERROR_RT_NO_DEVICE
	codeRTResourceAlloc    = 207005 // ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
	codeRTNoPermission     = 207006 // ACL_ERROR_RT_NO_PERMISSION
	codeRTNoEventResource  = 207007 // ACL_ERROR_RT_NO_EVENT_RESOURCE
	codeInternal           = 500000 // ACL_ERROR_INTERNAL_ERROR
	codeRTInternal         = 507000 // ACL_ERROR_RT_INTERNAL_ERROR
	codeRTDrvInternal      = 507899 // ACL_ERROR_RT_DRV_INTERNAL_ERROR
	codeHostRegistered     = 507910 // host memory already registered
	codeHostUnregistered   = 507911 // host memory not registered
)

// codes maps each known aclError to its name and backend error kind.
var codes = map[int32]struct {
	name string
	kind error
}{
	codeInvalidParam:       {"ACL_ERROR_INVALID_PARAM", backend.ErrInvalidArgument},
	codeUninitialize:       {"ACL_ERROR_UNINITIALIZE", backend.ErrUnavailable},
	codeRepeatInitialize:   {"ACL_ERROR_REPEAT_INITIALIZE", backend.ErrInvalidArgument},
	codeBadAlloc:           {"ACL_ERROR_BAD_ALLOC", backend.ErrOutOfMemory},
	codeAPINotSupport:      {"ACL_ERROR_API_NOT_SUPPORT", backend.ErrNotSupported},
	codeFeatureUnsupported: {"ACL_ERROR_FEATURE_UNSUPPORTED", backend.ErrNotSupported},
	codeRTParamInvalid:     {"ACL_ERROR_RT_PARAM_INVALID", backend.ErrInvalidArgument},
	codeRTInvalidDeviceID:  {"ACL_ERROR_RT_INVALID_DEVICEID", backend.ErrInvalidArgument},
	codeRTContextNull:      {"ACL_ERROR_RT_CONTEXT_NULL", backend.ErrUnavailable},
	codeRTInvalidMemType:   {"ACL_ERROR_RT_INVALID_MEMORY_TYPE", backend.ErrInvalidArgument},
	codeRTFeatureNotSup:    {"ACL_ERROR_RT_FEATURE_NOT_SUPPORT", backend.ErrNotSupported},
	codeRTMemoryAlloc:      {"ACL_ERROR_RT_MEMORY_ALLOCATION", backend.ErrOutOfMemory},
	codeRTMemoryFree:       {"ACL_ERROR_RT_MEMORY_FREE", backend.ErrInvalidArgument},
	codeRTNoDevice:         {"ACL_ERROR_RT_NO_DEVICE", backend.ErrUnavailable},
	codeRTResourceAlloc:    {"ACL_ERROR_RT_RESOURCE_ALLOC_FAIL", backend.ErrOutOfMemory},
	codeRTNoPermission:     {"ACL_ERROR_RT_NO_PERMISSION", backend.ErrNotPermitted},
	codeRTNoEventResource:  {"ACL_ERROR_RT_NO_EVENT_RESOURCE", backend.ErrOutOfMemory},
	codeInternal:           {"ACL_ERROR_INTERNAL_ERROR", backend.ErrUnavailable},
	codeRTInternal:         {"ACL_ERROR_RT_INTERNAL_ERROR", backend.ErrUnavailable},
	codeRTDrvInternal:      {"ACL_ERROR_RT_DRV_INTERNAL_ERROR", backend.ErrUnavailable},
	codeHostRegistered:     {"host memory already registered", backend.ErrInvalidArgument},
	codeHostUnregistered:   {"host memory not registered", backend.ErrInvalidArgument},
}

// Kind returns the backend error kind of an aclError code: the sentinel
// errors.Is matches. Codes the binding does not know are ErrUnavailable
// (a driver fault the caller cannot fix by changing arguments).
func Kind(code int32) error {
	if c, ok := codes[code]; ok {
		return c.kind
	}
	return backend.ErrUnavailable
}

// codeName names an aclError for messages.
func codeName(code int32) string {
	if c, ok := codes[code]; ok {
		return c.name
	}
	return fmt.Sprintf("aclError %d", code)
}

// driverError is the *backend.Error of a failed ACL call; sym is the C
// function that returned code.
func driverError(op backend.Op, sym string, code int32) *backend.Error {
	return &backend.Error{Op: op, Kind: Kind(code), Code: int(code), Msg: sym + " returned " + codeName(code)}
}

// invalid is a rejection by the binding itself, before any ACL call.
func invalid(op backend.Op, rule, format string, args ...any) *backend.Error {
	return backend.Errorf(op, backend.ErrInvalidArgument, rule, format, args...)
}
