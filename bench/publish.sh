#!/bin/sh
# Benchmark gpupin publish against crane on a loopback registry whose blobs
# (about GPUPIN_BENCH_BYTES, default 2 GiB) are on disk and already pushed.
# Not part of `make test`; a few minutes on 2 cores.
#
#   bench/publish.sh [benchtime]      (default 5x)
set -eu
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
if ! command -v crane >/dev/null 2>&1 && [ ! -x "$HOME/go/bin/crane" ]; then
	go install github.com/google/go-containerregistry/cmd/crane@v0.22.1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/gpupin" ./cmd/gpupin
GPUPIN_BIN="$tmp/gpupin" go test -run '^$' -bench BenchmarkPublish -benchtime "${1:-5x}" -timeout 30m ./build/ | tee "$tmp/out"
# crane / gpupin, per scenario: above 1 means gpupin is faster.
awk '/^BenchmarkPublish\//{ split($1, p, "/"); sub(/-[0-9]+$/, "", p[3]); t[p[2] "/" p[3]] = $3 }
END {
	for (s in t) { split(s, q, "/"); sc[q[1]] = 1 }
	for (x in sc) {
		printf "%-10s crane/gpupin(in-process) %.2f", x, t[x "/crane"] / t[x "/gpupin"]
		if (t[x "/gpupin-cli"] > 0) printf "   crane/gpupin(cli) %.2f", t[x "/crane"] / t[x "/gpupin-cli"]
		printf "\n"
	}
}' "$tmp/out"
