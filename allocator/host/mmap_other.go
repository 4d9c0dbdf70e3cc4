//go:build !unix

package host

import "errors"

const canMapAnonymous = false

func mapAnonymous(uint64) ([]byte, error) { return nil, errors.New("no anonymous mmap") }

func unmapAnonymous([]byte) error { return nil }
