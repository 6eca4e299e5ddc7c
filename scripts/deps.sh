#!/usr/bin/env bash
# Installs what the demo or the tests need on a fresh Debian machine, if it
# is missing, and does nothing when all is there.
#
#   scripts/deps.sh demo   what `make demo` runs on: containerd and runc (the
#                          real daemon gpupin-sandbox starts), a static
#                          busybox (the demo engine's images) and gcc (the
#                          cgo build of gpupin, for NVML). About a minute of
#                          apt on a fresh machine.
#   scripts/deps.sh [test] all of the above, and what only the tests need:
#     apt:  python3 (the torch probe's tests), docker-registry (a second real
#           registry), skopeo, pigz, isal (igzip), zstd and mmdebstrap;
#     Go, cached under $GPUPIN_TOOLS (default /var/tmp/gpupin-tools):
#           containerd v2.4.2 with its shim and ctr (the suite's second
#           daemon), containerd v1.7.35 and v2.1.9 (the releases fleets run:
#           make test-containerd17 / test-containerd21), crictl v1.34.0 (the
#           CRI tests), staticcheck v0.8.2 (make check) and nfd-worker
#           v0.17.3 (scripts/nfd-worker.sh: the NFD feature-file test),
#           etcd v3.6.16 and kube-apiserver v1.37.2 (scripts/kube-tools.sh:
#           the fleet tests' control plane), kubelet, kube-controller-manager
#           and kube-scheduler v1.37.2 (the same script: the e2e kubelet
#           and cluster tests), nfd-master beside nfd-worker, and Spegel
#           v0.7.4 (scripts/spegel.sh: the rollout tests' mirrors).
# The Go tools come through the Go module proxy; each is rebuilt only when
# the cached one is missing or is another version.
set -euo pipefail

mode=${1:-test}
case "$mode" in
demo | test) ;;
*)
	echo "usage: $0 [demo|test]" >&2
	exit 2
	;;
esac

TOOLS=${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}
CONTAINERD2_VERSION=v2.4.2
CONTAINERD17_VERSION=v1.7.35
CONTAINERD21_VERSION=v2.1.9
CRICTL_VERSION=v1.34.0
STATICCHECK_VERSION=v0.8.2

# --- Debian packages ---------------------------------------------------------
missing=()
cmds=(containerd runc)
[ "$mode" = test ] && cmds+=(python3 skopeo docker-registry pigz zstd mmdebstrap)
for cmd in "${cmds[@]}"; do
	command -v "$cmd" >/dev/null || missing+=("$cmd")
done
# igzip (Debian's isal): gzip layers decompress 2.5x faster than with unpigz,
# in gpupin's pulls and containerd 2.x's.
[ "$mode" = test ] && { command -v igzip >/dev/null || missing+=(isal); }
# kubectl, to run gpupin as its plugin (kubectl gpupin): any release runs
# plugins, so Debian's kubernetes-client does.
[ "$mode" = test ] && { command -v kubectl >/dev/null || missing+=(kubernetes-client); }
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

[ "$mode" = demo ] && exit 0

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
# release_build DEST MODULE VERSION: a containerd release whose go.mod has
# exclude directives, which go install refuses. Its module is downloaded,
# copied somewhere writable and built as the main module (about 2 minutes on
# 2 cores). DEST/.module records what was built: a main-module build has no
# version for go version -m to read.
release_build() {
	local dest=$1 mod=$2 ver=$3 bin
	if [ "$(cat "$dest/.module" 2>/dev/null)" = "$mod@$ver" ]; then
		for bin in containerd containerd-shim-runc-v2 ctr; do
			[ -x "$dest/$bin" ] || break
		done
		[ -x "$dest/$bin" ] && return 0
	fi
	command -v go >/dev/null || { echo "deps: go is not on PATH (export PATH=/usr/local/go/bin:\$PATH)" >&2; exit 1; }
	mkdir -p "$TOOLS"
	local tmp src
	tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
	chmod 755 "$tmp"
	echo "building $mod@$ver into $dest (module download and build; about 2 minutes on 2 cores)"
	src=$(cd "$tmp" && GOFLAGS= go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$src" ] || { echo "deps: go mod download $mod@$ver gave no directory" >&2; exit 1; }
	cp -r "$src" "$tmp/src"
	chmod -R u+w "$tmp/src"
	mkdir "$tmp/out"
	(cd "$tmp/src" && GOFLAGS=-mod=mod go build -o "$tmp/out/" ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr)
	echo "$mod@$ver" >"$tmp/out/.module"
	chmod 755 "$tmp/out"
	rm -rf "$dest"
	mv "$tmp/out" "$dest"
	rm -rf "$tmp"
}
release_build "$TOOLS/containerd-${CONTAINERD17_VERSION#v}" github.com/containerd/containerd "$CONTAINERD17_VERSION"
release_build "$TOOLS/containerd-${CONTAINERD21_VERSION#v}" github.com/containerd/containerd/v2 "$CONTAINERD21_VERSION"

go_has "$TOOLS/crictl" sigs.k8s.io/cri-tools "$CRICTL_VERSION" ||
	go_build "$TOOLS/crictl" sigs.k8s.io/cri-tools "$CRICTL_VERSION" cmd/crictl
go_has "$TOOLS/staticcheck" honnef.co/go/tools "$STATICCHECK_VERSION" ||
	go_build "$TOOLS/staticcheck" honnef.co/go/tools "$STATICCHECK_VERSION" cmd/staticcheck
# nfd-worker reads the agent's NFD feature file in a test; it needs a build
# of its own (scripts/nfd-worker.sh says why).
GPUPIN_TOOLS="$TOOLS" "$(dirname "$0")/nfd-worker.sh"
# etcd and kube-apiserver for the fleet tests, kubelet for the e2e kubelet
# test (internal/kubetest): about 12 minutes once on 2 cores (far more
# under other builds' load), then cached.
GPUPIN_TOOLS="$TOOLS" "$(dirname "$0")/kube-tools.sh"
# Spegel, each simulated node's peer-to-peer mirror in the rollout tests.
GPUPIN_TOOLS="$TOOLS" "$(dirname "$0")/spegel.sh"
exit 0
