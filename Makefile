# Tollgate: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
MODULES := shared testkit controlsvc filter deploy
PKGS := $(foreach m,$(MODULES),github.com/tollgate-rl/tollgate/$(m)/...) \
	github.com/tollgate-rl/tollgate/e2e/... github.com/tollgate-rl/tollgate/envoy/... github.com/tollgate-rl/tollgate/scripts/...

.PHONY: help deps browser peer helm build wasm-names images test run bench reliability soak lint ci fuzz clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

deps: ## install what the tests and `make run` need (redis-server, sentinel, tools, curl, skopeo, umoci, prometheus, node for the V8 host)
	@missing=""; \
	for b in redis-server:redis-server redis-sentinel:redis-sentinel redis-benchmark:redis-tools redis-cli:redis-tools curl:curl python3:python3 \
	  skopeo:skopeo umoci:umoci prometheus:prometheus promtool:prometheus node:nodejs; do \
	  command -v $${b%%:*} >/dev/null || missing="$$missing $${b##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi; \
	redis-server --version

# Helm, for the chart's tests (helm lint, helm template): from its module,
# for make test only (make run does not need it).
HELM_VERSION := v3.22.0

browser: ## install headless Chromium (Debian's chromium), for the console's browser tests; make test only
	@command -v chromium >/dev/null || { echo "installing: chromium"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

helm: ## build bin/helm, for the chart's tests
	@$(GO) version -m bin/helm 2>/dev/null | grep -q "$(HELM_VERSION)" || GOBIN=$(CURDIR)/bin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# The reference rate limit service, for the differential test and the
# benchmarks: its public module, at the commit Envoy Gateway 1.6 and 1.7 ship
# (testkit/peertest.Module names the same one).
PEER_MODULE := github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36

peer: ## build bin/service_cmd: envoyproxy/ratelimit, the peer the tests and benchmarks compare against
	@$(GO) version -m bin/service_cmd 2>/dev/null | grep -q "$(lastword $(subst @, ,$(PEER_MODULE)))" || GOBIN=$(CURDIR)/bin $(GO) install $(PEER_MODULE)

build: ## build bin/controlsvc, bin/tollgate-gateway and build/tollgate.wasm
	$(GO) build -o bin/controlsvc ./controlsvc/cmd/controlsvc
	$(GO) build -o bin/tollgate-gateway ./filter/devhost/cmd/tollgate-gateway
	$(GO) build -o bin/demo-upstream ./scripts/demo-upstream
	$(WASM_BUILD) -ldflags=-s -o ../build/tollgate.wasm .

# The module, built for Envoy. -ldflags=-s leaves out the Wasm name section
# (86 kB): Go's own panic traces keep their function names (they come from
# the module's data), only an engine's trap trace shows indexes instead.
WASM_BUILD = cd filter && GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath

wasm-names: ## build build/tollgate-names.wasm: the module with its name section, for scripts/wasm-size
	$(WASM_BUILD) -o ../build/tollgate-names.wasm .

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

images: build ## OCI images of the filter and the control service under build/images/ (layouts and .tar), no Docker needed
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags='-s -w' -o build/controlsvc-linux-amd64 ./controlsvc/cmd/controlsvc
	$(GO) run ./deploy/cmd/tollgate-images -version $(VERSION) -revision "$$(git rev-parse HEAD 2>/dev/null)" -created "$$(git log -1 --format=%ct 2>/dev/null || echo 0)"

test: deps browser peer helm ## run every module's tests with -race (installs redis-server and friends, and builds the peer, first)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

run: deps build ## Redis, control service, demo upstream and the gateway with the filter; Ctrl-C stops
	scripts/run.sh

bench: deps peer ## benchmark report: checks/s and p50/p99 vs redis-benchmark, memory per key
	scripts/bench.sh

reliability: deps build ## faults injected one at a time under load through the whole path: one row each, non-zero exit when a bound breaks
	$(GO) run ./scripts/reliability

soak: deps build ## ten minutes of 10,000 callers through the whole path: memory, goroutines and Redis over time, and their slopes
	$(GO) run ./scripts/reliability -soak $${SOAK:-10m}

lint: ## gofmt, go vet (native and wasip1 for shared), go mod tidy unchanged, no committed binaries
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	scripts/check-binaries.sh
	$(GO) vet $(PKGS)
	cd shared && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...
	cd filter && GOOS=wasip1 GOARCH=wasm $(GO) vet . ./proxywasm/... ./internal/... ./pluginconf/...
	cd filter && GOOS=wasip1 GOARCH=wasm $(GO) vet -tags tollgate_fakehost ./internal/plugin/ # scripts/codegen-floor.sh's build
	@for m in . $(MODULES); do \
	  (cd $$m && cp go.mod /tmp/go.mod.before && { [ ! -f go.sum ] || cp go.sum /tmp/go.sum.before; } && \
	   $(GO) mod tidy && diff -q /tmp/go.mod.before go.mod >/dev/null && { [ ! -f go.sum ] || diff -q /tmp/go.sum.before go.sum >/dev/null; }) \
	  || { echo "go mod tidy changes $$m: commit the tidy result"; exit 1; }; \
	done

ci: lint test ## what .ci/run runs

fuzz: ## run every fuzz target (each func Fuzz* in a test file) for FUZZTIME (default 10s)
	@for d in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for t in $$(grep -h '^func Fuzz' $$d/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $${FUZZTIME:-10s} $$d || exit 1; \
	  done; \
	done

clean: ## remove build output
	rm -rf bin build .run
