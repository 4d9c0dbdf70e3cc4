//go:build !linux

package host

import "errors"

// canReserve is false off Linux: expandable segments are unavailable and
// the default policy is the size-class allocator.
const canReserve = false

var errNoReserve = errors.New("no address-space reservation on this operating system")

func reserveVA(uint64) (uintptr, error) { return 0, errNoReserve }
func commitVA(uintptr, uint64) error    { return errNoReserve }
func decommitVA(uintptr, uint64) error  { return errNoReserve }
func unreserveVA(uintptr, uint64) error { return errNoReserve }
