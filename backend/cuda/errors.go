//go:build unix

package cuda

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/backend"
)

// kindOf maps a CUresult to the backend's error kind. Codes not listed are
// errors the binding cannot attribute to the caller; they count as the
// device being unavailable (a sticky context error such as 700 makes every
// later call fail too).
func kindOf(rc cuResult) error {
	switch rc {
	case cuErrOutOfMemory:
		return backend.ErrOutOfMemory
	case cuErrInvalidValue, cuErrInvalidDevice, cuErrInvalidContext, cuErrInvalidHandle,
		cuErrAlreadyMapped, cuErrNotMapped, cuErrNotFound,
		cuErrHostMemAlreadyRegisterd, cuErrHostMemNotRegistered:
		return backend.ErrInvalidArgument
	case cuErrNotSupported:
		return backend.ErrNotSupported
	case cuErrNotPermitted:
		return backend.ErrNotPermitted
	default: // 3, 4, 100, 401, 700, 802, 999 and anything new
		return backend.ErrUnavailable
	}
}

// cuErrorName names the codes the binding knows, for messages.
func cuErrorName(rc cuResult) string {
	switch rc {
	case cuErrInvalidValue:
		return "CUDA_ERROR_INVALID_VALUE"
	case cuErrOutOfMemory:
		return "CUDA_ERROR_OUT_OF_MEMORY"
	case cuErrNotInitialized:
		return "CUDA_ERROR_NOT_INITIALIZED"
	case cuErrDeinitialized:
		return "CUDA_ERROR_DEINITIALIZED"
	case cuErrNoDevice:
		return "CUDA_ERROR_NO_DEVICE"
	case cuErrInvalidDevice:
		return "CUDA_ERROR_INVALID_DEVICE"
	case cuErrInvalidContext:
		return "CUDA_ERROR_INVALID_CONTEXT"
	case cuErrAlreadyMapped:
		return "CUDA_ERROR_ALREADY_MAPPED"
	case cuErrNotMapped:
		return "CUDA_ERROR_NOT_MAPPED"
	case cuErrInvalidHandle:
		return "CUDA_ERROR_INVALID_HANDLE"
	case cuErrIllegalState:
		return "CUDA_ERROR_ILLEGAL_STATE"
	case cuErrNotFound:
		return "CUDA_ERROR_NOT_FOUND"
	case cuErrNotReady:
		return "CUDA_ERROR_NOT_READY"
	case cuErrIllegalAddress:
		return "CUDA_ERROR_ILLEGAL_ADDRESS"
	case cuErrHostMemAlreadyRegisterd:
		return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
	case cuErrHostMemNotRegistered:
		return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"
	case cuErrNotPermitted:
		return "CUDA_ERROR_NOT_PERMITTED"
	case cuErrNotSupported:
		return "CUDA_ERROR_NOT_SUPPORTED"
	}
	return fmt.Sprintf("CUresult %d", int32(rc))
}

// driverError is the *backend.Error for a failed driver call: the kind from
// kindOf, the CUresult in Code, and the exported symbol in the message.
func driverError(op backend.Op, s sym, rc cuResult) error {
	return &backend.Error{Op: op, Kind: kindOf(rc), Code: int(rc),
		Msg: fmt.Sprintf("%s: %s", symNames[s], cuErrorName(rc))}
}

// invalid is a *backend.Error for a call the binding rejects itself, before
// the driver sees it, because it breaks the backend contract (rule names the
// seed rule, if any).
func invalid(op backend.Op, rule, format string, args ...any) error {
	return backend.Errorf(op, backend.ErrInvalidArgument, rule, format, args...)
}
