package main

import "os"

// childEnv, when set in the environment, makes the test binary a child
// process of a test instead of running the tests (runTestChild): "cli"
// runs the command line given as its arguments, "hog" reserves 3 GiB of
// heap.
const childEnv = "VMMALLOC_TEST_CHILD"

// runTestChild does what childEnv asks and exits; without it, it returns.
// TestMain calls it first.
func runTestChild() {
	switch os.Getenv(childEnv) {
	case "cli":
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	case "hog":
		b := make([]byte, 3<<30)
		b[len(b)-1] = 1
		os.Exit(int(b[0])) // reached only when nothing limits the address space
	}
}
