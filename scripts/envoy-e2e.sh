#!/usr/bin/env bash
# End-to-end scenarios against a real Envoy (>= 1.33) running envoy/envoy.yaml
# with build/tollgate.wasm, the control service and the demo upstream.
# Envoy cannot be installed on the project's build machines; run this where it
# is. Loopback only; every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v envoy >/dev/null; then
  echo "scripts/envoy-e2e.sh needs Envoy >= 1.33 on PATH (not installed here)." >&2
  echo "The same scenarios run against the wazero gateway in 'make test' (e2e/)." >&2
  exit 2
fi
make build >/dev/null
run=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; scripts/redis.sh stop "$run"; rm -rf "$run"; }
trap cleanup EXIT
scripts/redis.sh start 6390 "$run"
dtoken=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
sed "s/CHANGE-ME-to-the-control-service-TOLLGATE_DECISION_TOKEN/$dtoken/" envoy/envoy.yaml >"$run/envoy.yaml"
TOLLGATE_REDIS_URL=redis://127.0.0.1:6390/0 TOLLGATE_ADMIN_TOKEN=e2e-admin-token-for-envoy-e2e-0123456789 \
  TOLLGATE_DECISION_TOKEN=$dtoken bin/controlsvc -config controlsvc/tollgate.example.toml >"$run/c.log" 2>&1 & pids+=($!)
bin/demo-upstream -listen 127.0.0.1:9000 >"$run/u.log" 2>&1 & pids+=($!)
envoy -c "$run/envoy.yaml" --log-level warn >"$run/envoy.log" 2>&1 & pids+=($!)
for _ in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:10000/ && break; sleep 0.2; done

fail=0
check() { if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1: got $2, want $3"; fail=1; fi; }
h=$(curl -s -D - -o /dev/null http://127.0.0.1:10000/api/v1/items)
check "allowed carries X-RateLimit-Limit" "$(echo "$h" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-ratelimit-limit"{print $2}')" 5
body=$(curl -s -H 'x-tollgate-identity: user:admin' http://127.0.0.1:10000/api/v1/profile)
check "upstream never sees a forged identity" "$(echo "$body" | grep -c 'user:admin' || true)" 0
codes=$(for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:10000/api/v1/orders; done)
check "the sixth request is refused" "${codes% }" "200 200 200 200 200 429"
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
check "control service down fails open" "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10000/api/v1/other)" 200
exit $fail
