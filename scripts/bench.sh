#!/bin/sh
# make bench: gpupin against ctr and crane on private containerds (Debian's
# 1.6 and, when scripts/deps.sh built it, 2.4.2) and loopback registries
# (go-containerregistry's, blobs on disk, and Debian's docker-registry),
# medians of several runs, beside the physical limit measured in the same
# run; prints a Markdown table and writes it to bench/results.md. Needs
# root and what `make deps` installs (containerd, runc, busybox-static,
# docker-registry, igzip, pigz, zstd). About 25 minutes on 2 cores; the
# first run also generates 2.5 GiB of random layers and 1 GiB of
# real-file layers (from this machine's /usr) into $GPUPIN_BENCH_CACHE.
#
#   scripts/bench.sh [flags for bench/main.go, e.g. -runs 5 -sections real,floor]
#   scripts/bench.sh -sections trust -out FILE   # only what a required signature
#                                                # policy adds (a few minutes)
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
# The fallback rows' second candidate runs the simulated probe.
[ -x "$BIN/gpupin-sim-probe" ] || CGO_ENABLED=0 "$GO" build -o "$BIN/gpupin-sim-probe" ./cmd/gpupin-sim-probe
"$GO" build -o "$BIN/gpupin-bench" ./bench
exec "$BIN/gpupin-bench" -gpupin "$BIN/gpupin" -crane "$crane" \
	-cache "${GPUPIN_BENCH_CACHE:-/var/tmp/gpupin-bench}" \
	-containerd ",${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}/containerd-2.4.2" -out bench/results.md "$@"
