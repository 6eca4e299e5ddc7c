#!/usr/bin/env bash
# Builds kube-apiserver v1.37.2 and etcd v3.6.16 into
# $GPUPIN_TOOLS/kube-1.37.2 (default /var/tmp/gpupin-tools) unless the cached
# binaries already are these versions: the fleet tests (internal/kubetest)
# start them on loopback.
#
# Neither installs with `go install`: k8s.io/kubernetes replaces its k8s.io/*
# staging modules with ./staging directories the module zip lacks, and etcd's
# server module replaces its siblings with ../ paths. Each is copied out of
# the module cache, its replaces dropped (the staging modules pinned to the
# release they ship with), and built as the main module. About 4 minutes for
# kube-apiserver and 1 for etcd on 2 cores, once.
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

if ! built_with "$DEST/kube-apiserver" k8s.io/apiserver "$STAGING_VERSION"; then
	tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
	src=$(dir_of "k8s.io/kubernetes@$KUBE_VERSION")
	cp -r "$src" "$tmp/src"
	chmod -R u+w "$tmp/src"
	rm -f "$tmp/src"/go.work*
	(
		cd "$tmp/src"
		# Every staging module: drop its replace, require the release.
		for m in $(local_replaces | grep '^k8s\.io/'); do
			go mod edit -dropreplace="$m" -require="$m@$STAGING_VERSION"
		done
		echo "building kube-apiserver $KUBE_VERSION (about 4 minutes on 2 cores, once)"
		# The version kube-apiserver reports (/version, --version).
		GOFLAGS=-mod=mod go build -o "$tmp/kube-apiserver" \
			-ldflags "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" \
			./cmd/kube-apiserver
	)
	mv -f "$tmp/kube-apiserver" "$DEST/kube-apiserver"
	rm -rf "$tmp"
	tmp=""
fi
