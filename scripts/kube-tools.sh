#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler and
# kubelet v1.37.2 and etcd v3.6.16 into
# $GPUPIN_TOOLS/kube-1.37.2 (default /var/tmp/gpupin-tools) unless the cached
# binaries already are these versions: the fleet tests (internal/kubetest)
# start etcd and kube-apiserver on loopback, and the kubelet test
# (e2e/kubelet_test.go) a standalone kubelet over a test's containerd, and
# the cluster test (e2e/cluster) all four over two kubelets.
#
# None installs with `go install`: k8s.io/kubernetes replaces its k8s.io/*
# staging modules with ./staging directories the module zip lacks, and etcd's
# server module replaces its siblings with ../ paths. Each is copied out of
# the module cache, its replaces dropped (the staging modules pinned to the
# release they ship with), and built as the main module. On 2 cores, once:
# about 1 minute for etcd, 4 for kube-apiserver and 7.5 for kubelet (less
# after kube-apiserver: they share most packages).
set -euo pipefail

TOOLS=${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}
KUBE_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
ETCD_VERSION=v3.6.16
DEST="$TOOLS/kube-${KUBE_VERSION#v}"

# built_with FILE MODULE VERSION: FILE is a Go binary that was built with
# MODULE@VERSION as a dependency (each is built as its own main module, whose
# version go version -m reports as "(devel)").
built_with() {
	[ -x "$1" ] && go version -m "$1" 2>/dev/null | awk '$1 == "dep" { print $2, $3 }' | grep -qxF "$2 $3"
}

command -v go >/dev/null || { echo "kube-tools.sh: go is not on PATH" >&2; exit 1; }
mkdir -p "$DEST"
# local_replaces: the modules go.mod replaces with a directory, in a
# `replace (...)` block or on a line of their own.
local_replaces() {
	awk '{ if ($1 == "replace") { p = $2; a = $3; t = $4 } else { p = $1; a = $2; t = $3 }
		if (a == "=>" && t ~ /^\.\.?\//) print p }' go.mod
}
tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
dir_of() { GOFLAGS= go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }

if ! built_with "$DEST/etcd" go.etcd.io/etcd/api/v3 "$ETCD_VERSION"; then
	tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
	src=$(dir_of "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
	cp -r "$src" "$tmp/src"
	chmod -R u+w "$tmp/src"
	(
		cd "$tmp/src"
		for m in $(local_replaces); do
			go mod edit -dropreplace="$m"
		done
		echo "building etcd $ETCD_VERSION (about 1 minute on 2 cores, once)"
		GOFLAGS=-mod=mod go build -o "$tmp/etcd" .
	)
	mv -f "$tmp/etcd" "$DEST/etcd"
	rm -rf "$tmp"
	tmp=""
fi

# kube_build CMD...: build ./cmd/CMD of k8s.io/kubernetes into $DEST for
# every CMD, in one `go build` from one copy of the module: the binaries
# share most of their packages, so the second and later cost little more.
kube_build() {
	tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
	local src="$tmp/src" c pkgs=()
	cp -r "$(dir_of "k8s.io/kubernetes@$KUBE_VERSION")" "$src"
	chmod -R u+w "$src"
	rm -f "$src"/go.work*
	# Every staging module: drop its replace, require the release.
	(cd "$src" && for m in $(local_replaces | grep '^k8s\.io/'); do
		go mod edit -dropreplace="$m" -require="$m@$STAGING_VERSION"
	done)
	for c in "$@"; do pkgs+=("./cmd/$c"); done
	echo "building $* $KUBE_VERSION (minutes on 2 cores, once)"
	mkdir "$tmp/out"
	# The version the binary reports (--version, kube-apiserver's /version,
	# kubelet's node status). -trimpath: the copy's directory is new each
	# run, and without it every package of the copy would miss Go's build
	# cache (its key holds the source directory).
	(cd "$src" && GOFLAGS=-mod=mod go build -trimpath -o "$tmp/out/" \
		-ldflags "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" \
		"${pkgs[@]}")
	for c in "$@"; do mv -f "$tmp/out/$c" "$DEST/$c"; done
}

# Each binary links a staging module of this release (kubelet k8s.io/kubelet,
# the others k8s.io/apiserver, the scheduler also k8s.io/kube-scheduler): a
# missing one or one built with another release is rebuilt, together with
# the others that need it.
want=()
built_with "$DEST/kube-apiserver" k8s.io/apiserver "$STAGING_VERSION" || want+=(kube-apiserver)
built_with "$DEST/kube-controller-manager" k8s.io/controller-manager "$STAGING_VERSION" || want+=(kube-controller-manager)
built_with "$DEST/kube-scheduler" k8s.io/kube-scheduler "$STAGING_VERSION" || want+=(kube-scheduler)
built_with "$DEST/kubelet" k8s.io/kubelet "$STAGING_VERSION" || want+=(kubelet)
if [ ${#want[@]} -gt 0 ]; then
	kube_build "${want[@]}"
fi
