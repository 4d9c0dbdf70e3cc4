//go:build !race

package pickle

const raceEnabled = false
