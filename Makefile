# gpupin: see README.md. `make demo` runs the whole flow; `make test` the tests.
GO        ?= go
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BIN       := bin
PKGS      := ./...

.PHONY: all deps build build-nocgo demo test fmt bench bench-publish fuzz clean

all: build

build:
	$(GO) build -o $(BIN)/gpupin ./cmd/gpupin
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpupin-cuda-probe ./cmd/gpupin-cuda-probe
	$(GO) build -o $(BIN)/gpupin-sandbox ./cmd/gpupin-sandbox

# The no-cgo build: no NVML, says so at run time.
build-nocgo:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpupin-nocgo ./cmd/gpupin

# What a fresh Debian machine lacks (containerd, runc, busybox-static, …).
deps:
	./scripts/deps.sh

demo: deps build
	BIN=$(BIN) ./scripts/demo.sh

# Tests start their own containerd (as root) and loopback registries.
test: deps build
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet ./node/ ./cmd/gpupin/
	$(GO) test -count=1 -timeout 20m $(PKGS)

fuzz:
	./scripts/fuzz.sh 30s

# The node-side table (bench/results.md): provision, plan, probe vs ctr and crane.
bench: build
	./scripts/bench.sh

# CI-side: publish of ~2 GiB of variants vs crane (build/bench_test.go).
bench-publish: build
	./bench/publish.sh 5x

fmt:
	gofmt -w .

clean:
	rm -rf $(BIN)
