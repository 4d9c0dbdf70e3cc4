package plan_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/arena/plan"
)

// A step's calls: Malloc a (call 0), Malloc b (1), Free a (2), Malloc c
// (3), Free b (4), Free c (5). The blocks a and c never live at the same
// time, so c reuses a's memory, and the region is the step's peak.
func Example() {
	ivs := []plan.Interval{
		{Size: 4096, Birth: 0, Death: 2}, // a
		{Size: 1000, Birth: 1, Death: 4}, // b, rounded up to 1024
		{Size: 2048, Birth: 3, Death: 5}, // c
	}
	offsets, size, err := plan.Pack(ivs, 512)
	if err != nil {
		panic(err)
	}
	fmt.Println("offsets:", offsets)
	fmt.Println("region:", size, "bytes; peak live:", plan.PeakLive(ivs, 512))
	fmt.Println("valid:", plan.Verify(ivs, offsets, 512, size) == nil)
	// Output:
	// offsets: [0 4096 0]
	// region: 5120 bytes; peak live: 5120
	// valid: true
}
