#!/usr/bin/env bash
# Runs each fuzz target of package fuzz for a bounded time, one after
# another (each on all cores), and fails on the first crasher, which Go
# writes to fuzz/testdata/fuzz/<Target>/ as a new regression case.
#
#   fuzz/run.sh            # 10s per target (what CI runs)
#   fuzz/run.sh 4h         # for hours
#   fuzz/run.sh 30s FuzzRealMemory FuzzParseConfig   # chosen targets
#   fuzz/run.sh 30s ./allocator/host:FuzzHostAllocator   # a target elsewhere
#
# A target is a name in package ./fuzz, or pkg:Name for one in another
# package.
#
# The duration is any -fuzztime value: a Go duration (10s, 2h) or an
# iteration count (5000x).
set -euo pipefail

T="${1:-10s}"
shift || true
if [ "$#" -gt 0 ]; then
	targets=("$@")
else
	targets=(FuzzAllocator FuzzAllocatorConfig FuzzRealMemory FuzzParseConfig FuzzHistory)
	# The trace readers (fuzz/readers_test.go): untrusted files.
	targets+=(FuzzPickle FuzzPyTorchSnapshot FuzzRMMLog FuzzBinaryTrace FuzzTextTrace)
	# Targets that live beside the code they fuzz.
	targets+=(./benchmarks/pickle:FuzzDecode ./allocator/host:FuzzHostAllocator ./stats/memviz:FuzzSettingValues ./arena:FuzzHeap ./allocator/ipc:FuzzDescriptor)
fi

cd "$(dirname "$0")/.."
for t in "${targets[@]}"; do
	pkg=./fuzz
	f="$t"
	if [[ "$t" == *:* ]]; then
		pkg="${t%%:*}"
		f="${t##*:}"
	fi
	echo "== $pkg $f for $T"
	# New inputs that widen coverage are minimised for at most 5s each,
	# so that short runs spend their time fuzzing.
	go test "$pkg" -run '^$' -fuzz "^${f}\$" -fuzztime "$T" -fuzzminimizetime 5s
done
