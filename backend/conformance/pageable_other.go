//go:build !linux

package conformance

import "errors"

// pageable is host memory the suite owns for HostRegister; only Linux has
// an implementation (mmap), elsewhere the registration checks skip.
type pageable struct{}

func newPageable(int) (*pageable, error) {
	return nil, errors.New("conformance: no pageable host memory on this OS")
}

func (*pageable) addr() uintptr { return 0 }
func (*pageable) unmap() error  { return nil }
