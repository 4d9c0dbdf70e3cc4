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
	targets=(FuzzAllocator FuzzAllocatorConfig FuzzRealMemory FuzzParseConfig FuzzHistory FuzzPlannedSteps FuzzPinnedHost)
	# The trace readers (fuzz/readers_test.go): untrusted files.
	targets+=(FuzzPickle FuzzPyTorchSnapshot FuzzRMMLog FuzzBinaryTrace FuzzTextTrace)
	# Targets that live beside the code they fuzz.
	targets+=(./benchmarks/pickle:FuzzDecode ./allocator/host:FuzzHostAllocator ./stats/memviz:FuzzSettingValues ./arena:FuzzHeap ./allocator/ipc:FuzzDescriptor ./arena/plan:FuzzPack ./backend/emulated:FuzzCostProfile)
fi

cd "$(dirname "$0")/.."
for t in "${targets[@]}"; do
	pkg=./fuzz
	f="$t"
	if [[ "$t" == *:* ]]; then
		pkg="${t%%:*}"
		f="${t##*:}"
	fi
	corpus="$pkg/testdata/fuzz/$f"
	for try in 1 2 3 4 5 6; do
		echo "== $pkg $f for $T"
		before=$(ls "$corpus" 2>/dev/null | sort || true)
		log=$(mktemp)
		# New inputs that widen coverage are minimised for at most 5s each,
		# so that short runs spend their time fuzzing.
		if go test "$pkg" -run '^$' -fuzz "^${f}\$" -fuzztime "$T" -fuzzminimizetime 5s 2>&1 | tee "$log"; then
			rm -f "$log"
			break
		fi
		after=$(ls "$corpus" 2>/dev/null | sort || true)
		# Go 1.26's fuzz coordinator can report a bare "context deadline
		# exceeded" when -fuzztime expires while a worker is mid-call
		# (go.dev/issue/75804, fixed in Go 1.27). That failure writes no
		# crasher; it is retried (at most five times: on a loaded machine,
		# where workers stall near the deadline, two in a row have been
		# seen). Anything else fails.
		if [ "$before" = "$after" ] && grep -q '^    context deadline exceeded$' "$log" &&
			! grep -q -e 'panic:' -e 'Failing input written' -e '^    [a-z_]*_test.go:' "$log" && [ "$try" -lt 6 ]; then
			echo "fuzz/run.sh: $f: Go fuzz coordinator shutdown race (no crasher written); retrying" >&2
			rm -f "$log"
			continue
		fi
		rm -f "$log"
		exit 1
	done
done
