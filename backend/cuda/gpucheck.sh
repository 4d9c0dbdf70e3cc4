#!/bin/sh
# gpucheck.sh: check vmmalloc against the real CUDA driver in one command.
#
#   backend/cuda/gpucheck.sh            on a machine with an NVIDIA GPU
#   backend/cuda/gpucheck.sh --double   the same checks against the C test
#                                       double (any Linux machine with cc)
#   backend/cuda/gpucheck.sh --build DIR
#                                       only build DIR/cuda.test, to carry to
#                                       a GPU machine without Go or network
#   backend/cuda/gpucheck.sh --profile FILE
#                                       also write the measured call costs
#                                       as a cost profile for the emulator
#                                       (vmmalloc replay --cost-profile FILE);
#                                       combines with --double
#
# It runs, through the purego binding (backend/cuda): the backend
# conformance suite; the allocator's real-memory integrity test (patterns
# checked through cuMemcpy); per-call latency of create/map/set-access/
# unmap/free/release of address ranges and handles (mean, median and p99
# over 1,000 calls of one granule and 20 of 512 MiB, VMMALLOC_GPUCHECK_N to
# change the 1,000; the 20 are a fiftieth of it), fitted per call + per GiB;
# and a replay of cs336_ctx128_fullstep.pickle scaled to fit the
# device, printing granularity, latencies and the replay's reserved/live;
# then, where PyTorch with CUDA is installed, a short training loop with
# vmmalloc as PyTorch's allocator (libvmmalloc.so) and with PyTorch's own,
# printing peak reserved/allocated of each (VMMALLOC_GPUCHECK_LIB: a
# prebuilt libvmmalloc.so). Lines of results start with GPUCHECK. It takes well under 5 minutes.
#
# Nothing is downloaded. The test binary is either built here from the
# module cache (GOPROXY=off: run `go mod download` once,
# or carry the cache) or given prebuilt: build it anywhere with
# `backend/cuda/gpucheck.sh --build DIR` (CGO_ENABLED=0: it needs only the
# C library and libcuda.so.1 at run time) and run
# `VMMALLOC_GPUCHECK_BIN=DIR/cuda.test backend/cuda/gpucheck.sh`.
#
# Environment: VMMALLOC_LIBCUDA (driver library path), VMMALLOC_TRACES
# (directory of the PyTorch traces; default ../shared/traces beside the
# module root), VMMALLOC_GPUCHECK_BIN (prebuilt test binary).
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
mode=real
profile=
usage() { echo "usage: $0 [--double] [--profile FILE] | --build DIR" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case "$1" in
	--double) mode=double; shift ;;
	--profile)
		[ $# -ge 2 ] || usage
		case "$2" in /*) profile=$2 ;; *) profile=$(pwd)/$2 ;; esac
		shift 2 ;;
	--build)
		[ $# -eq 2 ] || usage
		mkdir -p "$2"
		cd "$root"
		CGO_ENABLED=0 GOPROXY=off go test -c -o "$2/cuda.test" ./backend/cuda
		echo "gpucheck: built $2/cuda.test"
		exit 0 ;;
	*) usage ;;
	esac
done
if [ -n "$profile" ]; then
	export VMMALLOC_GPUCHECK_PROFILE="$profile"
fi

if [ "$mode" = real ]; then
	lib=${VMMALLOC_LIBCUDA:-}
	if [ -z "$lib" ]; then
		lib=$(/sbin/ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
	fi
	if [ -z "$lib" ] || [ ! -e "$lib" ]; then
		echo "gpucheck: SKIP: libcuda.so.1 not found: no NVIDIA driver on this machine (use --double to check the script against the test double)"
		exit 0
	fi
	echo "gpucheck: driver library $lib"
	command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L || true
	if command -v nm >/dev/null 2>&1; then
		# The _v2 exports the binding resolves (see backends.md §1.2).
		nm -D --defined-only "$lib" 2>/dev/null |
			grep -E ' (cuMem(GetInfo|HostRegister|HostGetDevicePointer|GetAddressRange|cpyHtoDAsync|cpyDtoHAsync|cpyDtoDAsync)_v2|cu(Stream|Event)Destroy_v2|cuDevicePrimaryCtxRelease_v2)$' |
			awk '{print "gpucheck: exports " $NF}' || true
	fi
	export VMMALLOC_LIBCUDA="$lib" VMMALLOC_GPUCHECK=1
else
	export VMMALLOC_GPUCHECK=double
fi

bin=${VMMALLOC_GPUCHECK_BIN:-}
if [ -z "$bin" ]; then
	command -v go >/dev/null 2>&1 || { echo "gpucheck: no Go toolchain: set VMMALLOC_GPUCHECK_BIN to a binary from --build" >&2; exit 2; }
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	bin=$tmp/cuda.test
	(cd "$root" && CGO_ENABLED=0 GOPROXY=off go test -c -o "$bin" ./backend/cuda)
fi
if [ -z "${VMMALLOC_TRACES:-}" ] && [ -d "$root/../shared/traces" ]; then
	export VMMALLOC_TRACES="$root/../shared/traces"
fi

# The test binary runs in the package directory, like go test.
cd "$root/backend/cuda"
status=0
timeout 280 "$bin" -test.run '^TestGPU' -test.v -test.count=1 -test.timeout 270s >"${TMPDIR:-/tmp}/gpucheck.$$.log" 2>&1 || status=$?
grep -E '^GPUCHECK|^--- (PASS|FAIL|SKIP)|^    --- FAIL|^(ok|FAIL|PASS)$' "${TMPDIR:-/tmp}/gpucheck.$$.log" || true
if [ $status -ne 0 ]; then
	echo "gpucheck: FAILED (status $status); full log:"
	cat "${TMPDIR:-/tmp}/gpucheck.$$.log"
fi
rm -f "${TMPDIR:-/tmp}/gpucheck.$$.log"

# PyTorch with vmmalloc as its allocator (cmd/libvmmalloc): a short
# training loop with vmmalloc as the current CUDA allocator, then the same
# loop with PyTorch's own, each printing peak reserved/allocated. Needs
# PyTorch with CUDA and either Go with cgo (to build libvmmalloc.so here)
# or VMMALLOC_GPUCHECK_LIB naming a libvmmalloc.so built elsewhere with
# cmd/libvmmalloc/build.sh.
torch_check() {
	if [ "$mode" != real ]; then
		echo "gpucheck: pytorch: SKIP: the PyTorch section needs a GPU (not run with --double)"
		return 0
	fi
	if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
		echo "gpucheck: pytorch: SKIP: PyTorch with CUDA is not installed"
		return 0
	fi
	so=${VMMALLOC_GPUCHECK_LIB:-}
	if [ -z "$so" ]; then
		if ! command -v go >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
			echo "gpucheck: pytorch: SKIP: no Go and C compiler to build libvmmalloc.so (set VMMALLOC_GPUCHECK_LIB)"
			return 0
		fi
		sodir=$(mktemp -d)
		GOPROXY=off "$root/cmd/libvmmalloc/build.sh" "$sodir" >/dev/null || { echo "gpucheck: pytorch: FAIL: building libvmmalloc.so"; return 1; }
		so=$sodir/libvmmalloc.so
	fi
	rc=0
	VMMALLOC_CONF=backend:cuda timeout 240 python3 "$root/cmd/libvmmalloc/torch_check.py" vmmalloc "$so" || rc=$?
	timeout 240 python3 "$root/cmd/libvmmalloc/torch_check.py" pytorch || rc=$?
	[ $rc -eq 0 ] || echo "gpucheck: pytorch: FAIL (status $rc)"
	return $rc
}
torch_check || status=$?
exit $status
