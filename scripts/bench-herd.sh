#!/bin/sh
# make bench-herd: a fleet rollout on one machine (faults/herd's
# BenchmarkHerd: N simulated nodes, each its own containerd and a real
# Spegel v0.7.4 as its mirror, one counting upstream registry, one
# kube-apiserver for the fetch gate), for N = $GPUPIN_HERD_NODES (default
# "4 8"), an image of $GPUPIN_HERD_MB MB (default 288) and an upstream link
# of each of $GPUPIN_HERD_LINK MB/s shared by every node (default "0 20";
# 0: no limit, the nodes' shared CPUs bound the rollout), against each
# containerd of $HERD_CONTAINERDS (default: $GPUPIN_TOOLS' 2.4.2 and
# 1.7.35). Writes the tables into bench/results.md's section
# "## Herd rollout (make bench-herd)", replacing that section and keeping
# the rest of the file. Needs root and what `make deps` installs
# (containerd releases, etcd and kube-apiserver, Spegel).
#
#   scripts/bench-herd.sh [extra go test flags]
set -eu
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
GO="${GO:-go}"
TOOLS="${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}"
export GPUPIN_TOOLS="$TOOLS"
CONTAINERDS="${HERD_CONTAINERDS:-$TOOLS/containerd-2.4.2 $TOOLS/containerd-1.7.35}"
MB="${GPUPIN_HERD_MB:-288}"
NODES="${GPUPIN_HERD_NODES:-4 8}"
LINK="${GPUPIN_HERD_LINK:-0 20}"
RESULTS="${HERD_RESULTS:-bench/results.md}"
export GPUPIN_HERD_MB="$MB" GPUPIN_HERD_NODES="$NODES" GPUPIN_HERD_LINK="$LINK"

[ "$(id -u)" = 0 ] || { echo "bench-herd: run as root (containerd, unshare --net)" >&2; exit 1; }
[ -x "$TOOLS/spegel" ] || { echo "bench-herd: $TOOLS/spegel missing: scripts/spegel.sh (make deps)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$tmp/rows"
start=$(date +%s)
versions=""
for d in $CONTAINERDS; do
	[ -x "$d/containerd" ] || { echo "bench-herd: $d/containerd missing (make deps)" >&2; exit 1; }
	v=$("$d/containerd" --version | awk '{print $3}')
	versions="$versions${versions:+, }$v"
	echo "== bench-herd against containerd $v: $NODES nodes, $MB MB, links $LINK MB/s" >&2
	GPUPIN_TEST_CONTAINERD="$d" PATH="$d:$PATH" GPUPIN_HERD_BENCH_OUT="$out" \
		"$GO" test -run '^$' -bench '^BenchmarkHerd$' -benchtime 1x -count 1 -timeout 60m -v "$@" ./faults/herd/ >&2
done
secs=$(( $(date +%s) - start ))
load=$(cut -d' ' -f1-3 /proc/loadavg)
ncpu=$(nproc)

section="$tmp/section"
{
	echo "## Herd rollout (make bench-herd)"
	echo
	echo "\`make bench-herd\` ($(date -u +%Y-%m-%d)): faults/herd's BenchmarkHerd, one run per row; containerd $versions;" \
		"$NODES nodes at once, each its own containerd and a real Spegel v0.7.4 as its mirror (certs.d/hosts.toml)," \
		"one upstream registry counting blob bytes (blobs on disk), one kube-apiserver for the fetch gate" \
		"(the agent's default lease, 30 s); an image of $MB MB in 8 random layers, one image per case;" \
		"$ncpu CPUs shared by every simulated node (and other work: load average at the end $load); total ${secs}s." \
		"Link: the upstream's blob bytes, all responses together, limited to that rate (the fleet's one link to its registry;" \
		"none: loopback, where the nodes' CPUs bound the rollout)."
	echo "Upstream images: blob bytes the upstream served / one image's. Makespan: the first node's start to the last node's end" \
		"(gpupin: resolve, wait, pull, unpack, probe, pin; ctr: pull and unpack). × alone: makespan / gpupin alone's."
	echo "Goal (issue 36): gpupin at most 1.25 images from upstream, makespan at most 1.5× one node alone."
	echo
	echo "| containerd | nodes | link | case | upstream images | makespan | × alone | notes |"
	echo "|---|---|---|---|---|---|---|---|"
	cat "$out"
	echo
	echo "How gpupin's time splits, per node (fetch: the pull's start to its last layer byte, gpupin extracting alongside;" \
		"unpack: the pull's rest after the last byte; probe + pin: the simulated probe and the pin; wait: the fetch gate):"
	echo
	echo "| containerd | nodes | link | node | resolve | gate wait | fetch | unpack | probe + pin | total |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	cat "$out.split"
	echo
	echo "The fetch gate's API requests per node during the rollout (a counting wrapper around each node's rest.Config" \
		"transport; a WATCH counts once, when it starts; per minute: over the node's own provision):"
	echo
	echo "| containerd | nodes | link | node | requests | by verb | provision | per minute |"
	echo "|---|---|---|---|---|---|---|---|"
	cat "$out.api"
} >"$section"

# Replace the section (from its heading to the next "## " heading or the
# end), or append it.
touch "$RESULTS"
awk -v sec="$section" '
	BEGIN { while ((getline l < sec) > 0) s = s l "\n" }
	/^## Herd rollout \(make bench-herd\)/ { skip = 1; printf "%s", s; done = 1; next }
	skip && /^## / { skip = 0; print ""; }
	!skip { print }
	END { if (!done) { print ""; printf "%s", s } }
' "$RESULTS" >"$tmp/results"
cp "$tmp/results" "$RESULTS"
cat "$section"
echo "bench-herd: wrote $RESULTS" >&2
