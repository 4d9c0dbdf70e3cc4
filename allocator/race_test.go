//go:build race

package allocator

// raceEnabled: the race detector is on; long tests run fewer rounds.
const raceEnabled = true
