#!/usr/bin/env bash
# Builds libvmmalloc.so and its header vmmalloc.h into OUTDIR (default:
# build/ at the repository root):
#
#   cmd/libvmmalloc/build.sh [OUTDIR]
#
# Needs Go and a C compiler (cgo). GOFLAGS (say -trimpath) pass through.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/build}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$root"
CGO_ENABLED=1 go build -buildmode=c-shared -o "$out/libvmmalloc.so" ./cmd/libvmmalloc
# go build writes the cgo header of the internal exports (vmmgo_*); the
# public header is vmmalloc.h.
rm -f "$out/libvmmalloc.h"
cp "$here/vmmalloc.h" "$out/vmmalloc.h"
echo "$out/libvmmalloc.so"
