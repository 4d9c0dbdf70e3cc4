//go:build !linux

package host

// physicalMemory is unknown here: the default budget is unlimited.
func physicalMemory() uint64 { return 0 }
