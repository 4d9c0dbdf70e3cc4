module github.com/vmmalloc/vmmalloc/benchmarks/galloc

go 1.26.8

replace github.com/vmmalloc/vmmalloc => ../..

require (
	github.com/gogpu/galloc v0.2.0
	github.com/vmmalloc/vmmalloc v0.0.0-00010101000000-000000000000
)
