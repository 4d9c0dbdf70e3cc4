// Package galloc measures vmmalloc's cache hit against gogpu/galloc's
// SyncAllocator (a pure-Go O(1) offset allocator behind one mutex), side by
// side in one process, in alternating rounds, so that both see the same
// machine load. It is a module of its own so that galloc never becomes a
// dependency of vmmalloc: nothing in the vmmalloc module imports it.
//
// The benchmarks report ns per operation of each allocator and their ratio
// (vmmalloc / galloc):
//
//	BenchmarkCacheHit     Malloc(4096)+Free with 100 live blocks around
//	                      it (as ../BenchmarkMallocFree/live=100), on the
//	                      default pool and inside a private pool
//	BenchmarkWarmReplay   the Malloc/Free calls of the shared snapshot
//	                      cs336_ctx128_fullstep replayed warm (as
//	                      ../replay BenchmarkWarmReplay/ids=dense); galloc
//	                      counts in 512-byte units, vmmalloc's rounding
//
// Run them with (the module proxy must serve github.com/gogpu/galloc, or
// point the module at a local checkout first with
// go mod edit -replace github.com/gogpu/galloc=DIR):
//
//	cd benchmarks/galloc && go test -run '^$' -bench . -benchtime 2000000x
package galloc
