#!/bin/sh
# make bench: gpupin against ctr and crane on one private containerd and one
# loopback registry (blobs on disk), medians of several runs; prints a
# Markdown table and writes it to bench/results.md. Needs root, containerd,
# runc and busybox-static (as `make test`). About 5 minutes on 2 cores; the
# first run also generates 2.5 GiB of random layers into $GPUPIN_BENCH_CACHE.
#
#   scripts/bench.sh [flags for bench/main.go, e.g. -runs 5 -sizes 512,2048]
set -eu
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
GO="${GO:-go}"
BIN="${BIN:-bin}"

crane=$(command -v crane 2>/dev/null || true)
if [ -z "$crane" ]; then
	crane="$("$GO" env GOPATH)/bin/crane"
	if [ ! -x "$crane" ]; then
		echo "bench: installing crane (the reference for plan)" >&2
		"$GO" install github.com/google/go-containerregistry/cmd/crane@v0.22.1
	fi
fi
command -v ctr >/dev/null || { echo "bench: ctr not found (apt-get install containerd)" >&2; exit 1; }

[ -x "$BIN/gpupin" ] || "$GO" build -o "$BIN/gpupin" ./cmd/gpupin
"$GO" build -o "$BIN/gpupin-bench" ./bench
exec "$BIN/gpupin-bench" -gpupin "$BIN/gpupin" -crane "$crane" \
	-cache "${GPUPIN_BENCH_CACHE:-/var/tmp/gpupin-bench}" -out bench/results.md "$@"
