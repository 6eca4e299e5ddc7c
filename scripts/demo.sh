#!/usr/bin/env bash
# The whole gpupin flow on this machine, with no GPU: a private containerd,
# a loopback registry holding a demo engine (cu13 + cu129), and simulated
# node facts. Every step that would need a GPU says SIMULATED.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-bin}
work=$(mktemp -d /tmp/gpupin-demo.XXXXXX)
sandbox_pid=
cleanup() {
	[ -n "$sandbox_pid" ] && kill "$sandbox_pid" 2>/dev/null && wait "$sandbox_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }

step "Starting a private containerd and a loopback registry with the demo engine"
"$bin/gpupin-sandbox" --env-file "$work/env" 2>"$work/sandbox.log" &
sandbox_pid=$!
for _ in $(seq 1 200); do [ -f "$work/env" ] && break; sleep 0.1; done
[ -f "$work/env" ] || { cat "$work/sandbox.log"; exit 1; }
# shellcheck disable=SC1091
. "$work/env"
export CONTAINERD_ADDRESS
export CONTAINERD_NAMESPACE=gpupin-demo
export GPUPIN_OVERRIDES="$work/overrides.yaml"
ref="$GPUPIN_REGISTRY/demo-engine:1.0.0"
gp() { "$bin/gpupin" "$@"; }
rt=(--runc-root "$GPUPIN_RUNC_ROOT" --probe-dir "$work/probe")
runopts=(--runc-root "$GPUPIN_RUNC_ROOT")
echo "containerd: $CONTAINERD_ADDRESS   registry: $GPUPIN_REGISTRY   engine: $ref"

step "The node (simulated: there is no GPU on this machine)"
show gp detect --node examples/nodes/h100-driver580.json

step "Plan on an older driver (575, CUDA 12.9): cu13 is rejected, with the reason"
show gp plan "$ref" --node examples/nodes/h100-driver575.json || true

step "Plan on a V100 (compute capability 7.0): cu13 has no kernels for it"
show gp plan "$ref" --node examples/nodes/v100-driver580.json || true

step "Plan on this node (driver 580, CUDA 13.0, H100): cu13 first, cu129 as fallback"
show gp plan "$ref" --node examples/nodes/h100-driver580.json

step "Provision: cu13's probe fails (the demo build is made to), auto falls back to cu129 and pins it"
show gp provision "$ref" --node examples/nodes/h100-driver580.json "${rt[@]}"

step "The pin: an image record named by digest, with its labels"
show gp pins --node examples/nodes/h100-driver580.json

step "Provision again: the pin answers, without the registry"
show gp provision "$ref" --node examples/nodes/h100-driver580.json "${rt[@]}"

step "A replica from the pin"
show gp run demo-engine:1.0.0 --node examples/nodes/h100-driver580.json "${runopts[@]}" -- /bin/sh -c 'echo "replica up: $(cat /proc/self/cgroup | head -1)"; echo CUDA_VERSION=$CUDA_VERSION'

step "An operator forces cu13: it is probed, fails, and the cu129 pin stays"
show gp override set demo-engine cu13
show gp provision "$ref" --node examples/nodes/h100-driver580.json "${rt[@]}" || echo "(exit $?: failed as expected)"
show gp pins --node examples/nodes/h100-driver580.json

step "The operator turns the engine off on this node"
show gp override set demo-engine none
show gp provision "$ref" --node examples/nodes/h100-driver580.json "${rt[@]}" || echo "(exit $?: disabled)"
show gp override clear demo-engine

step "Garbage collection: keeps the pin, removes what nothing uses"
show gp gc

printf '\nDemo done: every verdict above came from the SIMULATED probe, in real containers, on a real containerd.\n'
