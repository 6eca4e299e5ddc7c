#!/usr/bin/env bash
# Builds node-feature-discovery's nfd-worker and nfd-master into $GPUPIN_TOOLS (default
# /var/tmp/gpupin-tools) unless the cached binary is already this version:
# agent/nfdworker_test.go runs nfd-worker on the feature file the agent
# writes, and the cluster test (e2e/cluster) both, nfd-master labelling Nodes.
#
# `go install …/cmd/nfd-worker@v` fails: the Go module proxy refuses the
# module's version list, which go install reads for deprecations. The exact
# version is served, so the module is downloaded and built as the main
# module, with its replace of ./api/nfd (a module of its own, downloaded
# beside it). About 3.5 minutes on 2 cores, once.
set -euo pipefail

TOOLS=${GPUPIN_TOOLS:-/var/tmp/gpupin-tools}
NFD_VERSION=v0.17.3

have() { [ -x "$TOOLS/$1" ] && "$TOOLS/$1" -version 2>&1 | grep -qxF "$1 $NFD_VERSION"; }
if have nfd-worker && have nfd-master && [ -s "$TOOLS/nfd-api-crds.yaml" ]; then
	exit 0
fi
command -v go >/dev/null || { echo "nfd-worker.sh: go is not on PATH" >&2; exit 1; }
mkdir -p "$TOOLS"
tmp=$(mktemp -d "$TOOLS/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dir_of() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
mod=$(dir_of "sigs.k8s.io/node-feature-discovery@$NFD_VERSION")
api=$(dir_of "sigs.k8s.io/node-feature-discovery/api/nfd@$NFD_VERSION")
cp -r "$mod" "$tmp/src"
chmod -R u+w "$tmp/src"
rm -rf "$tmp/src/api/nfd"
cp -r "$api" "$tmp/src/api/nfd"
chmod -R u+w "$tmp/src/api/nfd"
echo "building nfd-worker and nfd-master $NFD_VERSION"
mkdir "$tmp/out"
(cd "$tmp/src" && go build -o "$tmp/out/" \
	-ldflags "-X sigs.k8s.io/node-feature-discovery/pkg/version.version=$NFD_VERSION" ./cmd/nfd-worker ./cmd/nfd-master)
# NFD's CRDs (NodeFeature, NodeFeatureRule, NodeFeatureGroup), which the
# cluster test applies for nfd-master and nfd-worker.
cp "$tmp/src/deployment/base/nfd-crds/nfd-api-crds.yaml" "$tmp/out/nfd-api-crds.yaml"
mv "$tmp/out/nfd-worker" "$tmp/out/nfd-master" "$tmp/out/nfd-api-crds.yaml" "$TOOLS/"
