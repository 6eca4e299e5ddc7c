#!/usr/bin/env bash
# Builds Spegel v0.7.4 into $GPUPIN_TOOLS/spegel (default /var/tmp/gpupin-tools)
# unless the cached binary is that release: the fleet-rollout tests run one
# beside each simulated node's containerd as that node's peer-to-peer mirror.
#
# The Go module proxy serves Spegel's dependencies but not Spegel itself, so
# its release source ships in third_party/ (MIT, upstream's own files,
# commit 79779e2) and is built as the main module. About 2 minutes on 2
# cores, once.
set -euo pipefail

TOOLS=${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}
SPEGEL_VERSION=v0.7.4
SRC=${SPEGEL_SRC:-"$(cd "$(dirname "$0")/.." && pwd)/third_party/spegel-$SPEGEL_VERSION.tar.gz"}

if [ "$(cat "$TOOLS/spegel.version" 2>/dev/null)" = "$SPEGEL_VERSION" ] && [ -x "$TOOLS/spegel" ]; then
	exit 0
fi
command -v go >/dev/null || { echo "spegel.sh: go is not on PATH" >&2; exit 1; }
mkdir -p "$TOOLS"
tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$SRC" -C "$tmp"
echo "building spegel $SPEGEL_VERSION (about 2 minutes on 2 cores, once)"
(cd "$tmp"/spegel-* && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -o "$tmp/spegel" .)
mv -f "$tmp/spegel" "$TOOLS/spegel"
echo "$SPEGEL_VERSION" >"$TOOLS/spegel.version"
