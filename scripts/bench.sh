#!/usr/bin/env bash
# `make bench`: Go benchmarks of the hot paths, then the control service's
# report against a fresh loopback Redis. Bounded in count and time.
set -euo pipefail
cd "$(dirname "$0")/.."
run=$(mktemp -d)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])' 2>/dev/null || echo 6391)
trap 'scripts/redis.sh stop "$run"; rm -rf "$run"' EXIT
scripts/redis.sh start "$port" "$run"

echo "== Go benchmarks (limiter scripts on a real Redis, rule matching)"
go test -run '^$' -bench . -benchtime 2000x -benchmem ./controlsvc/internal/limiter/ ./shared/rules/ ./shared/wire/ | grep -E '^(Benchmark|ok)'
# One check at a time on a kept-alive connection: latency, and the service's
# own allocations per check.
go test -run '^$' -bench 'CheckOverTheWire|RLSOverGRPC' -benchtime 5000x ./controlsvc/internal/app/ | grep -E '^Benchmark'
echo
echo "== Filter under wazero (compiled tollgate.wasm) and the same logic natively"
go test -run '^$' -bench 'Compile|Instantiate' -benchtime 3x ./filter/filtertest/ | grep -E '^Benchmark'
go test -run '^$' -bench 'MemoryAfter100k' -benchtime 1x ./filter/filtertest/ | grep -E '^Benchmark'
go test -run '^$' -bench 'Request|TickWatching' -benchtime 5000x -benchmem ./filter/filtertest/ | grep -E '^Benchmark' | tee "$run/wasm.txt"
go test -run '^$' -bench 'Native' -benchtime 5000x -benchmem ./filter/internal/plugin/ | grep -E '^Benchmark' | tee "$run/native.txt"
# Each ratio beside the two figures it is made of, from this run: the lease
# hit and the callout again at 50,000 requests, past the guest's first
# collection (its heap's first 4 MiB touch fresh pages) and the native
# build's warm-up, which 5,000 do not reach.
go test -run '^$' -bench 'RequestLeaseHit$|RequestCallout$' -benchtime 50000x ./filter/filtertest/ | grep -E '^Benchmark' >>"$run/steady.txt"
go test -run '^$' -bench 'NativeLeaseHit$|NativeRequestCallout$' -benchtime 50000x ./filter/internal/plugin/ | grep -E '^Benchmark' >>"$run/steady.txt"
nsop() { awk -v b="$2" '$1 ~ "^"b"-[0-9]+$" {print $3; exit}' "$1"; }
ratio() { # ENGINE WHAT ENGINE-NS NATIVE-NS
  awk -v eng="$1" -v what="$2" -v a="$3" -v b="$4" 'BEGIN { if (a > 0 && b > 0) printf "%s under %s / natively: %.1f / %.1f µs = %.1f×\n", what, eng, a/1000, b/1000, a/b }'
}
ratio wazero "lease hit" "$(nsop "$run/steady.txt" BenchmarkRequestLeaseHit)" "$(nsop "$run/steady.txt" BenchmarkNativeLeaseHit)"
ratio wazero "callout  " "$(nsop "$run/steady.txt" BenchmarkRequestCallout)" "$(nsop "$run/steady.txt" BenchmarkNativeRequestCallout)"
# The same lease hit after the caches were swept: the request's own time.
metric() { awk -v b="$2" -v m="$3" '$1 ~ "^"b"-[0-9]+$" {for (i = 2; i < NF; i++) if ($(i+1) == m) {print $i; exit}}' "$1"; }
ratio wazero "lease hit, caches cold" "$(metric "$run/wasm.txt" BenchmarkRequestLeaseHitCold ns-request)" "$(metric "$run/native.txt" BenchmarkNativeLeaseHitCold ns-request)"
# The same module under V8, the engine Envoy embeds (Node.js, TurboFan only
# as Envoy runs it, with a proxy-wasm host in JavaScript: filtertest's
# testdata/v8host.mjs).
go test -run '^$' -bench 'V8' -benchtime 20000x ./filter/filtertest/ | grep -E '^Benchmark' | tee "$run/v8.txt"
ratio V8 "lease hit" "$(metric "$run/v8.txt" BenchmarkV8 ns-lease-hit)" "$(nsop "$run/steady.txt" BenchmarkNativeLeaseHit)"
ratio V8 "callout  " "$(metric "$run/v8.txt" BenchmarkV8 ns-callout)" "$(nsop "$run/steady.txt" BenchmarkNativeRequestCallout)"
echo
echo "== Go's code generation for Wasm alone: the plugin and its test host, all in Wasm, no host calls"
scripts/codegen-floor.sh
echo
echo "== What the module's size is made of"
make -s build wasm-names
echo "shipped module (name section stripped): $(wc -c <build/tollgate.wasm) bytes (TestModuleSize's bound: 3500000)"
go run ./scripts/wasm-size -top 15 build/tollgate-names.wasm
echo
echo "== Control service"
go run ./controlsvc/cmd/tollgate-bench -redis "127.0.0.1:$port"

echo
echo "== Side by side with envoyproxy/ratelimit (same Redis, same load, separate processes)"
make -s build
# The peer is bin/service_cmd, which `make bench` builds first (make peer).
peer="bin/service_cmd"
go run ./scripts/peer-bench -redis "127.0.0.1:$port" -controlsvc bin/controlsvc -peer "$peer"

echo
echo "== Gateway with and without the filter (control service on the same Redis)"
make -s build
cport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
printf '[[tiers]]\nname = "free"\nlimit = 1000000\nwindow_seconds = 60\n' >"$run/bench.toml"
export TOLLGATE_DECISION_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
TOLLGATE_LISTEN=127.0.0.1:$cport TOLLGATE_REDIS_URL=redis://127.0.0.1:$port/0 TOLLGATE_LOG_LEVEL=error \
  bin/controlsvc -config "$run/bench.toml" >"$run/controlsvc.log" 2>&1 &
cpid=$!
trap 'kill $cpid 2>/dev/null; scripts/redis.sh stop "$run"; rm -rf "$run"' EXIT
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$cport/health" && break; sleep 0.1; done
go run ./scripts/gateway-bench -control "http://127.0.0.1:$cport" -lease 50
go run ./scripts/gateway-bench -control "http://127.0.0.1:$cport" -lease 50 -callers 4 -requests 10000
go run ./scripts/gateway-bench -control "http://127.0.0.1:$cport" -lease 0 -requests 5000 -rounds 2
