//go:build unix

package cuda

import "unsafe"

// The C ABI of the CUDA driver, written by hand from the driver API
// documentation (no header is used). Layouts are the same on x86-64 and
// arm64; the size assertions below fail the build if a field moves.

// cuResult is CUresult.
type cuResult int32

// CUresult values the binding tells apart.
const (
	cuSuccess                    cuResult = 0
	cuErrInvalidValue            cuResult = 1
	cuErrOutOfMemory             cuResult = 2
	cuErrNotInitialized          cuResult = 3
	cuErrDeinitialized           cuResult = 4
	cuErrNoDevice                cuResult = 100
	cuErrInvalidDevice           cuResult = 101
	cuErrInvalidContext          cuResult = 201
	cuErrAlreadyMapped           cuResult = 208
	cuErrNotMapped               cuResult = 211
	cuErrInvalidHandle           cuResult = 400
	cuErrIllegalState            cuResult = 401
	cuErrNotFound                cuResult = 500
	cuErrNotReady                cuResult = 600
	cuErrIllegalAddress          cuResult = 700
	cuErrHostMemAlreadyRegisterd cuResult = 712
	cuErrHostMemNotRegistered    cuResult = 713
	cuErrNotPermitted            cuResult = 800
	cuErrNotSupported            cuResult = 801
	cuErrUnknown                 cuResult = 999
)

// cuMemLocation is CUmemLocation.
type cuMemLocation struct {
	Type int32 // CU_MEM_LOCATION_TYPE_DEVICE = 1
	ID   int32 // device ordinal
}

// cuMemAllocationProp is CUmemAllocationProp.
type cuMemAllocationProp struct {
	Type                 int32 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	RequestedHandleTypes int32 // bitmask; CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
	Location             cuMemLocation
	Win32HandleMetaData  uintptr // NULL
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]byte
}

// cuMemAccessDesc is CUmemAccessDesc.
type cuMemAccessDesc struct {
	Location cuMemLocation
	Flags    int32 // CU_MEM_ACCESS_FLAGS_PROT_NONE 0, READ 1, READWRITE 3
}

// Compile-time layout checks: each line fails to build if the size differs.
var (
	_ [unsafe.Sizeof(cuMemLocation{}) - 8]struct{}
	_ [8 - unsafe.Sizeof(cuMemLocation{})]struct{}
	_ [unsafe.Sizeof(cuMemAllocationProp{}) - 32]struct{}
	_ [32 - unsafe.Sizeof(cuMemAllocationProp{})]struct{}
	_ [unsafe.Offsetof(cuMemAllocationProp{}.CompressionType) - 24]struct{}
	_ [24 - unsafe.Offsetof(cuMemAllocationProp{}.CompressionType)]struct{}
	_ [unsafe.Sizeof(cuMemAccessDesc{}) - 12]struct{}
	_ [12 - unsafe.Sizeof(cuMemAccessDesc{})]struct{}
)

// Enum and flag values.
const (
	cuMemLocationTypeDevice    = 1
	cuMemAllocationTypePinned  = 1
	cuMemHandleTypePosixFD     = 1
	cuGranularityMinimum       = 0
	cuGranularityRecommended   = 1
	cuStreamNonBlocking        = 1
	cuEventDisableTiming       = 2
	cuAttrVMMSupported         = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	cuAttrPosixFDSupported     = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
	cuMemHostAllocPortable     = 0x1
	cuMemHostAllocDeviceMap    = 0x2
	cuMemHostRegisterPortable  = 0x1
	cuMemHostRegisterDeviceMap = 0x2
	cuMemHostRegisterIOMemory  = 0x4
	cuMemHostRegisterReadOnly  = 0x8
)
