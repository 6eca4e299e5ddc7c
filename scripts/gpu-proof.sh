#!/usr/bin/env bash
# gpu-proof.sh: prove both compute probes on a real NVIDIA GPU in one short run.
#
# Needs: an NVIDIA GPU and driver, containerd (with ctr), the NVIDIA Container
# Toolkit (nvidia-ctk, for the CDI spec), Go, and root. It builds gpupin and
# gpupin-cuda-probe, runs the cuda probe on the host, pulls a PyTorch image and
# a plain CUDA base image, runs `gpupin probe` on each and prints each verdict.
#
#   sudo scripts/gpu-proof.sh
#
# Environment (all optional):
#   TORCH_IMAGE   PyTorch image for the torch probe  (default below; its CUDA must not be newer than the driver's)
#   CUDA_IMAGE    image without a CUDA toolkit for the cuda probe
#   ADDRESS       containerd socket                  (/run/containerd/containerd.sock)
#   NAMESPACE     containerd namespace               (gpupin-proof)
#   GPUS          devices for --gpus                 (all)
#   OUT           where binaries and logs go         (a new temporary directory)
set -euo pipefail

TORCH_IMAGE=${TORCH_IMAGE:-docker.io/pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime}
CUDA_IMAGE=${CUDA_IMAGE:-docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04}
ADDRESS=${ADDRESS:-/run/containerd/containerd.sock}
NAMESPACE=${NAMESPACE:-gpupin-proof}
GPUS=${GPUS:-all}
OUT=${OUT:-$(mktemp -d /tmp/gpupin-proof.XXXXXX)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

say() { printf '\n== %s\n' "$*"; }
die() { printf 'gpu-proof: %s\n' "$*" >&2; exit 2; }

for tool in go nvidia-smi ctr nvidia-ctk; do
	command -v "$tool" >/dev/null || die "$tool not found in PATH"
done
[ -S "$ADDRESS" ] || die "no containerd socket at $ADDRESS (set ADDRESS)"
[ "$(id -u)" = 0 ] || die "run as root (containerd and CDI need it)"

say "GPU and driver"
nvidia-smi --query-gpu=index,name,uuid,compute_cap,driver_version --format=csv
nvidia-smi | sed -n 's/.*\(CUDA Version: [0-9.]*\).*/\1 (the newest CUDA the driver runs)/p'

say "CDI spec"
if ls /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json >/dev/null 2>&1; then
	ls /etc/cdi /var/run/cdi 2>/dev/null || true
else
	echo "none found: generating /var/run/cdi/nvidia.yaml"
	mkdir -p /var/run/cdi
	nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml
fi
nvidia-ctk cdi list

say "build into $OUT"
cd "$ROOT"
CGO_ENABLED=0 go build -o "$OUT/gpupin-cuda-probe" ./cmd/gpupin-cuda-probe
CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$OUT/gpupin" ./cmd/gpupin
file "$OUT/gpupin-cuda-probe" || true

status=0
say "cuda probe on the host (the driver path, no container)"
"$OUT/gpupin-cuda-probe" | tee "$OUT/host-cuda.log" || status=1

probe() { # probe KIND IMAGE
	local kind=$1 image=$2 log="$OUT/$1.log"
	say "pull $image"
	if ! ctr -a "$ADDRESS" -n "$NAMESPACE" images pull "$image" >/dev/null; then
		echo "-> $kind probe: FAIL (cannot pull $image)"
		status=1
		return
	fi
	say "$kind probe in $image"
	if "$OUT/gpupin" --address "$ADDRESS" --namespace "$NAMESPACE" \
		probe --json --probe "$kind" --gpus "$GPUS" "$image" 2>&1 | tee "$log"; then
		echo "-> $kind probe: PASS"
	else
		echo "-> $kind probe: FAIL (log: $log)"
		status=1
	fi
}

probe torch "$TORCH_IMAGE"
probe cuda "$CUDA_IMAGE"

say "summary"
if [ "$status" = 0 ]; then
	echo "both probes computed on the GPU (logs in $OUT)"
else
	echo "a probe failed (logs in $OUT)"
fi
exit "$status"
