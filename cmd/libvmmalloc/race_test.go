//go:build race

package main

// raceEnabled: the tests run under the race detector, whose Go-side timings
// are not comparable with the C library's.
const raceEnabled = true
