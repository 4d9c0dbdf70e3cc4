//go:build !(linux && (amd64 || arm64 || riscv64 || loong64 || ppc64le))

package emulated

import "github.com/vmmalloc/vmmalloc/backend"

// newReal reports that real memory needs Linux on a 64-bit platform.
func newReal(*config) (backing, error) {
	return nil, backingErrorf(backend.ErrNotSupported, "WithRealMemory needs Linux on a 64-bit platform")
}
