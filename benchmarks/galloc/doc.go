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
//	BenchmarkWarmReplayPlanned  the same with planned steps on and
//	                      vmmalloc's MarkStep after each pass (as
//	                      ../replay BenchmarkWarmReplay/ids=dense/planned)
//
// The module proxy this project uses does not serve github.com/gogpu/galloc
// (it answers 403), so point the module at a checkout of it (v0.2.0)
// first, and let go fill go.sum; then run them:
//
//	cd benchmarks/galloc
//	go mod edit -replace github.com/gogpu/galloc=DIR && go mod tidy
//	go test -run '^$' -bench CacheHit -benchtime 1000000x
//	go test -run '^$' -bench WarmReplay -benchtime 400x
//
// (or leave go.mod alone: copy it to x.mod, edit that, and pass
// -modfile=x.mod to each go command).
package galloc
