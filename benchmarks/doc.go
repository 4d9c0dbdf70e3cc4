// Package benchmarks holds vmmalloc's go test -bench suites: the
// allocator's hot path (cache-hit Malloc+Free with 10², 10⁴ and 10⁶ live
// blocks around it) and synthetic training workloads that report
// fragmentation (peak reserved / peak allocated) and driver calls per step
// for expandable and classic segments side by side. Subpackages hold the
// trace formats (trace, pickle), workload generators (workload) and the
// replay engine (replay).
//
// Run them with:
//
//	go test ./benchmarks/ -run '^$' -bench . -benchmem
package benchmarks
