package allocator_test

import (
	"fmt"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// ExampleAllocator_MarkStep runs a training loop whose step makes the
// same calls every time, marking the end of each step: after two
// identical steps the default pool plans the step, and later steps are
// served from the plan without a driver call.
func ExampleAllocator_MarkStep() {
	drv, _ := emulated.New(emulated.WithCapacity(8 << 30))
	cfg, _ := allocator.ParseConfig("planned_steps:True")
	a, _ := allocator.New(drv, cfg)
	defer a.Close()

	step := func() {
		act, _ := a.Malloc(64<<20, 0)  // activations
		grad, _ := a.Malloc(32<<20, 0) // gradients
		_ = a.Free(act)
		tmp, _ := a.Malloc(48<<20, 0) // a temporary of the optimizer
		_ = a.Free(tmp)
		_ = a.Free(grad)
	}
	logStep := func(i int) {
		st := a.StepStats()
		fmt.Printf("step %d: %s, driver calls so far %d\n", i, st.State, a.Stats().NumDeviceAlloc)
	}
	for i := 0; i < 6; i++ {
		step()
		if err := a.MarkStep(); err != nil { // once per training step
			panic(err)
		}
		logStep(i)
	}
	st := a.StepStats()
	fmt.Printf("plan: %d blocks in %d MiB, peak live %d MiB\n", st.PlannedBlocks, st.PlanBytes>>20, st.PeakLiveBytes>>20)
	// Output:
	// step 0: learning, driver calls so far 3
	// step 1: learning, driver calls so far 3
	// step 2: planned, driver calls so far 5
	// step 3: planned, driver calls so far 5
	// step 4: planned, driver calls so far 5
	// step 5: planned, driver calls so far 5
	// plan: 3 blocks in 96 MiB, peak live 96 MiB
}
