#!/usr/bin/env bash
# What Go's code generation for Wasm costs, with no host in the way: the
# plugin's native lease hit and callout benchmarks (the plugin and its test
# host, proxytest, in one program) run natively, then the same program
# built for wasip1 (-tags tollgate_fakehost) under V8 as Envoy runs it and
# under wazero. No call crosses to a host, so each ratio is the compiler's
# and the engine's alone: the floor under the filter's own ratio to native.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bench='NativeLeaseHit$|NativeRequestCallout$'
n=${CODEGEN_FLOOR_N:-100000}
(cd filter && GOOS=wasip1 GOARCH=wasm go test -tags tollgate_fakehost -c -o "$out/plugin.wasm" ./internal/plugin/)
wazero=$(cd filter && go list -m -f '{{.Version}}' github.com/tetratelabs/wazero)
(cd filter && go test -run '^$' -bench "$bench" -benchtime "${n}x" ./internal/plugin/) | grep -E '^Benchmark' >"$out/native.txt"
node --no-liftoff --no-warnings scripts/wasirun.mjs "$out/plugin.wasm" -test.run '^$' -test.bench "$bench" -test.benchtime "${n}x" |
  grep -E '^Benchmark' >"$out/v8.txt"
go run "github.com/tetratelabs/wazero/cmd/wazero@$wazero" run "$out/plugin.wasm" -test.run '^$' -test.bench "$bench" -test.benchtime "${n}x" |
  grep -E '^Benchmark' >"$out/wazero.txt"
nsop() { awk -v b="$2" '$1 ~ "^"b"(-[0-9]+)?$" {print $3; exit}' "$1"; }
for b in BenchmarkNativeLeaseHit BenchmarkNativeRequestCallout; do
  awk -v what="${b#BenchmarkNative}" -v nat="$(nsop "$out/native.txt" $b)" -v v8="$(nsop "$out/v8.txt" $b)" -v wz="$(nsop "$out/wazero.txt" $b)" \
    'BEGIN { printf "%-15s all Go, no host: natively %.1f µs, V8 %.1f µs (%.1f×), wazero %.1f µs (%.1f×)\n", what, nat/1000, v8/1000, v8/nat, wz/1000, wz/nat }'
done
