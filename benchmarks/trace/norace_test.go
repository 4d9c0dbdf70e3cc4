//go:build !race

package trace

// raceEnabled reports whether the race detector is on; tests that read
// every shared trace skip under it (CI's -race run) to stay lean.
const raceEnabled = false
