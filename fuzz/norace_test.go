//go:build !race

package fuzz

// raceEnabled reports whether the race detector is on; tests that repeat
// a workload many times sample fewer cases under it.
const raceEnabled = false
