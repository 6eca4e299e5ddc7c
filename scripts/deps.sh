#!/usr/bin/env bash
# Installs what the demo and the tests need on a fresh Debian machine, if it
# is missing, and does nothing when all is there:
#   apt:  containerd and runc (the real daemon the tests start), a static
#         busybox (the test images), python3 (the torch probe's tests), gcc
#         (cgo and the stand-in CUDA driver), docker-registry (a second real
#         registry), skopeo, pigz, isal (igzip) and zstd;
#   go install, cached under $GPUPIN_TOOLS (default /var/tmp/gpupin-tools):
#         containerd v2.4.2 with its shim and ctr (the suite's second daemon),
#         crictl v1.34.0 (the CRI tests), staticcheck v0.8.2 (make test) and
#         nfd-worker v0.17.3 (scripts/nfd-worker.sh: the NFD feature-file test),
#         etcd v3.6.16 and kube-apiserver v1.37.2 (scripts/kube-tools.sh: the
#         fleet tests' control plane).
# The Go tools come through the Go module proxy; each is rebuilt only when
# the cached binary is missing or says another version (go version -m).
set -euo pipefail

TOOLS=${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}
CONTAINERD2_VERSION=v2.4.2
CRICTL_VERSION=v1.34.0
STATICCHECK_VERSION=v0.8.2

# --- Debian packages ---------------------------------------------------------
missing=()
for cmd in containerd runc python3 skopeo docker-registry pigz zstd mmdebstrap; do
	command -v "$cmd" >/dev/null || missing+=("$cmd")
done
# igzip (Debian's isal): gzip layers decompress 2.5x faster than with unpigz,
# in gpupin's pulls and containerd 2.x's.
command -v igzip >/dev/null || missing+=(isal)
# The test images need busybox without a libc: Debian's busybox-static.
if command -v dpkg-query >/dev/null; then
	dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" || missing+=(busybox-static)
else
	[ -x /bin/busybox ] || missing+=(busybox-static)
fi
command -v gcc >/dev/null || missing+=(gcc libc6-dev)

if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
		echo "missing: ${missing[*]}; install them (Debian: apt-get install ${missing[*]}), as root" >&2
		exit 1
	fi
	echo "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# containerd and docker-registry come with services that their
	# postinst starts (systemd, or sysvinit scripts where there is no
	# systemd): the tests start daemons of their own, and a system
	# docker-registry would sit on port 5000. A policy-rc.d that answers
	# 101 ("action forbidden") keeps invoke-rc.d and deb-systemd-invoke from
	# starting anything during this install; one already there is kept.
	policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		trap 'rm -f "$policy"' EXIT
	fi
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	if [ -n "$policy" ]; then rm -f "$policy"; trap - EXIT; fi
	# Whatever did start, under systemd, is stopped and left disabled: the
	# tests never use the system services.
	if [ -d /run/systemd/system ]; then
		for svc in docker-registry; do
			case " ${missing[*]} " in *" $svc "*) systemctl disable --now "$svc" >/dev/null 2>&1 || true ;; esac
		done
	fi
fi

# --- Go tools, cached --------------------------------------------------------
# go_has FILE MODULE VERSION: FILE is a Go binary built from MODULE@VERSION.
go_has() {
	[ -x "$1" ] && go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $2, $3 }' | grep -qxF "$2 $3"
}

# go_build DEST MODULE VERSION PKG...: go install the packages into a
# scratch directory beside DEST, then move it (a directory of binaries) or
# its one binary into place, so an interrupted build leaves no half cache.
go_build() {
	local dest=$1 mod=$2 ver=$3
	shift 3
	command -v go >/dev/null || { echo "deps: go is not on PATH (export PATH=/usr/local/go/bin:\$PATH)" >&2; exit 1; }
	mkdir -p "$TOOLS"
	local tmp
	tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
	chmod 755 "$tmp"
	echo "building $mod@$ver into $dest (through the Go module proxy; about a minute on 2 cores for containerd)"
	local pkg
	for pkg in "$@"; do
		# Outside any module: the project's go.mod must not steer the tool's
		# dependencies.
		(cd "$tmp" && GOBIN="$tmp" GOFLAGS= go install "$mod/$pkg@$ver")
	done
	if [ $# -eq 1 ]; then
		mv -f "$tmp/$(basename "$1")" "$dest"
		rmdir "$tmp"
	else
		rm -rf "$dest"
		mv "$tmp" "$dest"
	fi
}

ctd2="$TOOLS/containerd-${CONTAINERD2_VERSION#v}"
for bin in containerd containerd-shim-runc-v2 ctr; do
	if ! go_has "$ctd2/$bin" github.com/containerd/containerd/v2 "$CONTAINERD2_VERSION"; then
		go_build "$ctd2" github.com/containerd/containerd/v2 "$CONTAINERD2_VERSION" \
			cmd/containerd cmd/containerd-shim-runc-v2 cmd/ctr
		break
	fi
done
go_has "$TOOLS/crictl" sigs.k8s.io/cri-tools "$CRICTL_VERSION" ||
	go_build "$TOOLS/crictl" sigs.k8s.io/cri-tools "$CRICTL_VERSION" cmd/crictl
go_has "$TOOLS/staticcheck" honnef.co/go/tools "$STATICCHECK_VERSION" ||
	go_build "$TOOLS/staticcheck" honnef.co/go/tools "$STATICCHECK_VERSION" cmd/staticcheck
# nfd-worker reads the agent's NFD feature file in a test; it needs a build
# of its own (scripts/nfd-worker.sh says why).
GPUPIN_TOOLS="$TOOLS" "$(dirname "$0")/nfd-worker.sh"
# etcd and kube-apiserver for the fleet tests (internal/kubetest): about 5
# minutes once on 2 cores (23 under other builds' load), then cached.
GPUPIN_TOOLS="$TOOLS" "$(dirname "$0")/kube-tools.sh"
exit 0
