# gpupin: see README.md. `make demo` runs the whole flow; `make test` the tests.
GO        ?= go
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BIN       := bin
PKGS      := ./...
# scripts/deps.sh caches the Go-built tools here: containerd 2.4.2 (the
# suite's second daemon), 1.7.35 and 2.1.9 (releases fleets run), crictl,
# staticcheck, nfd-worker, and etcd, kube-apiserver and kubelet 1.37.2.
export GPUPIN_TOOLS ?= /var/tmp/gpupin-tools
CONTAINERD2 ?= $(GPUPIN_TOOLS)/containerd-2.4.2
CONTAINERD17 ?= $(GPUPIN_TOOLS)/containerd-1.7.35
CONTAINERD21 ?= $(GPUPIN_TOOLS)/containerd-2.1.9
# The packages whose behaviour depends on the daemon's release: the suite
# runs them again against 1.7 and 2.1.
DAEMON_PKGS ?= ./containerd/... ./e2e/... ./faults/...
STATICCHECK ?= $(GPUPIN_TOOLS)/staticcheck
TESTFLAGS ?= -count=1 -timeout 20m

.PHONY: all deps deps-demo dist test-dist build build-nocgo image demo test test-short check test-helm test-cosign test-cluster test-containerd1 test-containerd2 test-containerd17 test-containerd21 require-root fmt bench bench-publish bench-herd fuzz clean

all: build

build:
	$(GO) build -o $(BIN)/gpupin ./cmd/gpupin
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpupin-cuda-probe ./cmd/gpupin-cuda-probe
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpupin-sim-probe ./cmd/gpupin-sim-probe
	$(GO) build -o $(BIN)/gpupin-sandbox ./cmd/gpupin-sandbox

# The no-cgo build: no NVML, says so at run time.
build-nocgo:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpupin-nocgo ./cmd/gpupin

# gpupin's own container image (gpupin, the cuda and sim probes, glibc, CA
# certificates), assembled by `gpupin build` as an OCI layout in
# $(IMAGE_OUT)/layout, with $(IMAGE_OUT)/daemonset.yaml naming it by digest.
# `make image PUSH=1` publishes it as $(IMAGE_REPO):$(IMAGE_VERSION), the
# image deploy/kubernetes/daemonset.yaml names (registry credentials from
# the Docker config, as for gpupin publish).
IMAGE_REPO    ?= ghcr.io/gpupin/gpupin
IMAGE_VERSION ?= 0.1.0
IMAGE_OUT     ?= $(BIN)/image
image:
	PUSH=$(PUSH) GO=$(GO) ./deploy/image/build.sh $(IMAGE_OUT) $(IMAGE_REPO) $(IMAGE_VERSION)

# The release layout for nodes without Kubernetes: $(DIST)/gpupin_V_linux_ARCH.tar.gz
# and $(DIST)/gpupin_V_ARCH.deb (nfpm, through tools/dist, a module of its
# own): gpupin in /usr/bin (and kubectl-gpupin, a link to it, the kubectl
# plugin), its probe programs in /usr/lib/gpupin (where
# gpupin looks), the agent's systemd unit (not enabled) and a commented
# /etc/gpupin/agent.yaml (a conffile). test-dist installs the .deb with
# dpkg, detects and provisions from the installed paths, and purges it.
# $(DIST)/charts is a Helm chart repository (the chart's archive and
# index.yaml, through tools/helm) to serve at $(CHART_URL) as it is.
DIST         ?= dist
CHART_URL    ?= https://gpupin.github.io/gpupin/charts
DIST_VERSION ?= 0.1.0
DIST_ARCH    ?= $(shell $(GO) env GOARCH)
dist: build
	cd tools/dist && $(GO) run . -root $(CURDIR) -bin $(abspath $(BIN)) -out $(abspath $(DIST)) -version $(DIST_VERSION) -arch $(DIST_ARCH)
	cd tools/helm && $(GO) run ./cmd/gpupin-chart -chart $(CURDIR)/deploy/helm/gpupin -out $(abspath $(DIST))/charts -version $(DIST_VERSION) -url $(CHART_URL)

test-dist: require-root dist
	BIN=$(BIN) DEB=$(DIST)/gpupin_$(DIST_VERSION)_$(DIST_ARCH).deb ./scripts/dist-test.sh
	test -s $(DIST)/charts/gpupin-$(DIST_VERSION).tgz && grep -q "gpupin-$(DIST_VERSION).tgz" $(DIST)/charts/index.yaml

# What a fresh Debian machine lacks. deps-demo: only what the demo runs on
# (containerd, runc, busybox-static, gcc). deps: that and what the tests
# need (docker-registry, skopeo, …; containerd 2.4.2, 1.7.35 and 2.1.9,
# crictl, staticcheck, nfd-worker, etcd, kube-apiserver and kubelet built
# through the Go module proxy and cached in $(GPUPIN_TOOLS)).
deps:
	./scripts/deps.sh test

deps-demo:
	./scripts/deps.sh demo

demo: deps-demo build
	BIN=$(BIN) ./scripts/demo.sh

# Tests start their own containerd (as root) and loopback registries. The
# suite runs twice: against Debian's containerd 1.6 (from PATH), then against
# containerd 2.4.2 (GPUPIN_TEST_CONTAINERD, its directory first in PATH so
# ctr and the shim are its own); then DAEMON_PKGS against 1.7.35 and 2.1.9,
# the releases fleets run. As non-root the tests that run containers
# would skip; make test refuses to run then, so nothing is skipped unseen.
# One pass after the other, also under make -j: two suites at once would
# time each other out on a small machine.
test: require-root deps build
	$(MAKE) --no-print-directory check
	$(MAKE) --no-print-directory test-helm
	$(MAKE) --no-print-directory test-cosign
	$(MAKE) --no-print-directory test-cluster
	$(MAKE) --no-print-directory test-containerd1
	$(MAKE) --no-print-directory test-containerd2
	$(MAKE) --no-print-directory test-containerd17
	$(MAKE) --no-print-directory test-containerd21
	$(MAKE) --no-print-directory test-dist

check:
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet ./node/ ./cmd/gpupin/
	$(STATICCHECK) $(PKGS)
	cd tools/dist && $(GO) vet . && $(STATICCHECK) .
	cd tools/helm && $(GO) vet -tags nonvml,cluster . && $(STATICCHECK) -tags nonvml,cluster .
	cd tools/cosign && $(GO) vet . && $(STATICCHECK) .

# The fast tier: no daemon, no root (README). Not part of `make test`,
# which runs everything in it too, against real parts.
test-short:
	$(GO) test -short -count=1 $(PKGS)

# The Helm chart (deploy/helm/gpupin), through Helm v4's Go packages pinned
# in tools/helm, a module of its own: rendered against the plain manifests'
# expectations and installed on a real kube-apiserver (internal/kubetest).
# -tags nonvml: Helm brings Go's plugin package (through kustomize), whose
# binaries bind every C symbol at start, and NVML's exist only where a
# driver is; the chart's test needs no NVML.
test-helm:
	cd tools/helm && $(GO) test -tags nonvml $(TESTFLAGS) .

# Signatures both ways against cosign's own code (cosign v3, pinned in
# tools/cosign, a module of its own so its KMS and TUF clients stay out of
# gpupin's): what gpupin publish/build --sign-key writes passes cosign's
# verification, what cosign signs passes gpupin's, cosign's keys load.
test-cosign: build
	cd tools/cosign && GPUPIN_BIN=$(abspath $(BIN))/gpupin $(GO) test $(TESTFLAGS) .

# gpupin as users install it, on a real cluster (tools/helm/cluster_test.go,
# build tag cluster): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, two kubelets over two containerds, nfd-master and
# nfd-worker, the chart installed with Helm's Go packages, gpupin's image
# from a local registry. Against containerd 2.4.2 and 1.7.35.
CLUSTER_CONTAINERDS ?= $(CONTAINERD2) $(CONTAINERD17)
test-cluster: require-root
	@for d in $(CLUSTER_CONTAINERDS); do \
		echo "== cluster test against $$($$d/containerd --version)"; \
		(cd tools/helm && GPUPIN_TEST_CONTAINERD=$$d PATH="$$d:$$PATH" $(GO) test -tags nonvml,cluster -run '^TestClusterSimulated$$' -v $(TESTFLAGS) .) || exit 1; \
	done

test-containerd1: require-root
	@echo "== go test against $$(containerd --version)"
	$(GO) test $(TESTFLAGS) $(PKGS)

test-containerd2: require-root
	@echo "== go test against $$($(CONTAINERD2)/containerd --version)"
	GPUPIN_TEST_CONTAINERD=$(CONTAINERD2) PATH="$(CONTAINERD2):$$PATH" $(GO) test $(TESTFLAGS) $(PKGS)

test-containerd17: require-root
	@echo "== go test $(DAEMON_PKGS) against $$($(CONTAINERD17)/containerd --version)"
	GPUPIN_TEST_CONTAINERD=$(CONTAINERD17) PATH="$(CONTAINERD17):$$PATH" $(GO) test $(TESTFLAGS) $(DAEMON_PKGS)

test-containerd21: require-root
	@echo "== go test $(DAEMON_PKGS) against $$($(CONTAINERD21)/containerd --version)"
	GPUPIN_TEST_CONTAINERD=$(CONTAINERD21) PATH="$(CONTAINERD21):$$PATH" $(GO) test $(TESTFLAGS) $(DAEMON_PKGS)

require-root:
	@[ "$$(id -u)" = 0 ] || { echo "make test: run it as root: the tests start containerd and run containers, and as non-root they would skip" >&2; exit 1; }

fuzz:
	./scripts/fuzz.sh 30s

# The node-side table (bench/results.md): provision, plan, probe vs ctr and crane.
bench: build
	./scripts/bench.sh

# A fleet rollout on one machine (faults/herd's BenchmarkHerd): 4 and 8
# simulated nodes, each its containerd and a real Spegel, one counting
# upstream, one kube-apiserver for the fetch gate; gpupin vs ctr on every
# node vs one node alone, images from upstream and makespan, against
# containerd 2.4.2 and 1.7.35, over an unlimited upstream (the CPUs bound
# it) and over one 20 MB/s link the nodes share (the link bounds it).
# Writes its section of bench/results.md. GPUPIN_HERD_NODES="4 8",
# GPUPIN_HERD_MB=288, GPUPIN_HERD_LINK="0 20" to change the herd.
bench-herd: require-root
	GO=$(GO) HERD_CONTAINERDS="$(CONTAINERD2) $(CONTAINERD17)" ./scripts/bench-herd.sh

# CI-side: publish of ~2 GiB of variants vs crane (build/bench_test.go).
bench-publish: build
	./bench/publish.sh 5x

fmt:
	gofmt -w .

clean:
	rm -rf $(BIN) $(DIST)
