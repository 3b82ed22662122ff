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
go test -run '^$' -bench . -benchtime 2000x -benchmem ./controlsvc/internal/limiter/ ./shared/rules/ | grep -E '^(Benchmark|ok)'
echo
echo "== Filter under wazero (compiled tollgate.wasm) and the same logic natively"
go test -run '^$' -bench 'Compile|Instantiate' -benchtime 3x ./filter/filtertest/ | grep -E '^Benchmark'
go test -run '^$' -bench 'Request|Native' -benchtime 5000x -benchmem ./filter/filtertest/ | grep -E '^Benchmark'
echo
echo "== Control service"
go run ./controlsvc/cmd/tollgate-bench -redis "127.0.0.1:$port" "$@"
