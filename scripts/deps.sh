#!/usr/bin/env bash
# Installs what the demo and the tests need on a fresh Debian machine, if it
# is missing: containerd and runc (the real daemon the tests start), a static
# busybox (the test images), python3 (the torch probe's tests) and gcc (cgo
# and the stand-in CUDA driver). Does nothing when all are there.
set -euo pipefail
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
# The test images need busybox without a libc: Debian's busybox-static.
if command -v dpkg-query >/dev/null; then
	dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" || missing+=(busybox-static)
else
	[ -x /bin/busybox ] || missing+=(busybox-static)
fi
command -v python3 >/dev/null || missing+=(python3)
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
	echo "missing: ${missing[*]}; install them (Debian: apt-get install ${missing[*]}), as root" >&2
	exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
