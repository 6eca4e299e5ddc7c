#!/bin/bash
# Builds gpupin's own container image as an OCI layout with `gpupin build`:
# gpupin (cgo, for NVML), gpupin-cuda-probe and gpupin-sim-probe (static),
# the glibc gpupin and libnvidia-ml need, and the CA certificates; no
# Docker engine, reproducible (SOURCE_DATE_EPOCH, default 0).
#
#   deploy/image/build.sh OUT [REPOSITORY [VERSION]]
#
# writes OUT/layout (the OCI layout), OUT/index (the index digest) and
# OUT/daemonset.yaml (deploy/kubernetes/daemonset.yaml naming the image by
# digest). PUSH=1 also publishes REPOSITORY:VERSION (default
# ghcr.io/gpupin/gpupin:0.1.0, the image the DaemonSet names).
set -euo pipefail
out=${1:?usage: build.sh OUT [REPOSITORY [VERSION]]}
repo=${2:-ghcr.io/gpupin/gpupin}
version=${3:-0.1.0}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
GO=${GO:-go}
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}

rm -rf "$out"
mkdir -p "$out/spec/root/usr/local/bin" "$out/spec/root/usr/lib/gpupin" "$out/spec/root/etc/ssl/certs" "$out/spec/root/tmp"
root=$out/spec/root
(cd "$top" && $GO build -trimpath -ldflags=-s -o "$root/usr/local/bin/gpupin" ./cmd/gpupin)
(cd "$top" && CGO_ENABLED=0 $GO build -trimpath -ldflags=-s -o "$root/usr/lib/gpupin/gpupin-cuda-probe" ./cmd/gpupin-cuda-probe)
(cd "$top" && CGO_ENABLED=0 $GO build -trimpath -ldflags=-s -o "$root/usr/lib/gpupin/gpupin-sim-probe" ./cmd/gpupin-sim-probe)
chmod 1777 "$root/tmp"

# glibc: what gpupin links (ldd), and what libnvidia-ml.so.1, dlopened by
# NVML's Go binding, links besides. Copied as files, at the paths the
# loader and ldconfig (which the nvidia runtime runs in the container)
# search by default.
libs=$(ldd "$root/usr/local/bin/gpupin" | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
for name in libpthread.so.0 libdl.so.2 libm.so.6 librt.so.1 libresolv.so.2; do
	for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
		if [ -e "$dir/$name" ]; then libs="$libs $dir/$name"; break; fi
	done
done
for lib in $libs; do
	case $lib in
	*/ld-linux-x86-64.so.2) dest=$root/lib64/ld-linux-x86-64.so.2 ;;
	*) dest=$root/lib/x86_64-linux-gnu/$(basename "$lib") ;;
	esac
	mkdir -p "$(dirname "$dest")"
	cp -L "$lib" "$dest"
done
mkdir -p "$root/etc/ld.so.conf.d"
printf '/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n/usr/lib64\n' >"$root/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
printf 'include /etc/ld.so.conf.d/*.conf\n' >"$root/etc/ld.so.conf"
# The CA certificates registries' TLS is checked against.
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/usr/local/bin/gpupin\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

sed -e "s|@VERSION@|$version|" -e "s|@REPOSITORY@|$repo|" "$here/gpupin.yaml.in" >"$out/spec/gpupin.yaml"
push=()
if [ "${PUSH:-}" = 1 ]; then push=(--push); fi
"$root/usr/local/bin/gpupin" build -f "$out/spec/gpupin.yaml" --output "$out/layout" "${push[@]}" --json >"$out/build.json"
index=$(sed -n 's/^  "index": "\(sha256:[0-9a-f]*\)".*/\1/p' "$out/build.json")
[ -n "$index" ] || { echo "build.sh: no index digest in $out/build.json" >&2; exit 1; }
echo "$index" >"$out/index"
# The DaemonSet, naming this very image by digest (production pins by digest).
sed -e "s|image: ghcr.io/gpupin/gpupin:[^ ]*|image: $repo@$index|" "$top/deploy/kubernetes/daemonset.yaml" >"$out/daemonset.yaml"
echo "gpupin image $repo:$version = $index: OCI layout $out/layout, manifest $out/daemonset.yaml${PUSH:+ (pushed)}"
