#!/usr/bin/env bash
# `make run`: Redis, the control service, a demo upstream and the gateway
# running the filter, all on loopback, with curl commands to try. Ctrl-C stops
# everything.
set -euo pipefail
cd "$(dirname "$0")/.."
run=.run
redis_port=${TOLLGATE_RUN_REDIS_PORT:-6390}
control=${TOLLGATE_LISTEN:-127.0.0.1:8081}
gateway=${TOLLGATE_RUN_GATEWAY:-127.0.0.1:8080}
upstream=${TOLLGATE_RUN_UPSTREAM:-127.0.0.1:9000}
random_token() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
token=${TOLLGATE_ADMIN_TOKEN:-$(random_token)}
# The filter's service credential: the control service requires it on its
# decision API, and the gateway's filter sends it.
dtoken=${TOLLGATE_DECISION_TOKEN:-$(random_token)}
# The run directory holds the filter's credential (plugin-config.json) and
# Redis's append-only file with its API key hashes: readable by this user only.
umask 077
mkdir -p "$run"
chmod 700 "$run"
sed "s/CHANGE-ME-to-the-control-service-TOLLGATE_DECISION_TOKEN/$dtoken/" filter/plugin-config.example.json >"$run/plugin-config.json"

pids=()
stopped=
cleanup() {
  [ -n "$stopped" ] && return
  stopped=1
  echo; echo "stopping..."
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/redis.sh stop "$run"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

await() { # name url pid log
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "$2" && return 0
    kill -0 "$3" 2>/dev/null || { echo "$1 exited:"; tail -5 "$4"; exit 1; }
    sleep 0.1
  done
  echo "$1 did not come up; see $4"; exit 1
}

scripts/redis.sh start "$redis_port" "$run" aof
TOLLGATE_LISTEN=$control TOLLGATE_REDIS_URL=redis://127.0.0.1:$redis_port/0 TOLLGATE_ADMIN_TOKEN=$token \
  TOLLGATE_DECISION_TOKEN=$dtoken bin/controlsvc -config controlsvc/tollgate.example.toml >"$run/controlsvc.log" 2>&1 &
pids+=($!); await controlsvc "http://$control/health" "${pids[-1]}" "$run/controlsvc.log"
bin/demo-upstream -listen "$upstream" >"$run/upstream.log" 2>&1 &
pids+=($!); await demo-upstream "http://$upstream/" "${pids[-1]}" "$run/upstream.log"
bin/tollgate-gateway -wasm build/tollgate.wasm -plugin-config "$run/plugin-config.json" \
  -listen "$gateway" -upstream "http://$upstream" -cluster "controlsvc=http://$control" >"$run/gateway.log" 2>&1 &
pids+=($!); await gateway "http://$gateway/healthz" "${pids[-1]}" "$run/gateway.log"

cat <<TXT

Tollgate is running on loopback (logs in $run/):
  gateway with the filter  http://$gateway   -> demo upstream http://$upstream
  control service          http://$control  (Redis 127.0.0.1:$redis_port)
The demo's free tier allows 5 requests a minute per caller.

  # allowed: X-RateLimit-* and RateLimit headers back, x-tollgate-* seen upstream
  curl -i http://$gateway/api/v1/items

  # the sixth request in a minute answers 429 with Retry-After and RATE_LIMIT_EXCEEDED
  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' http://$gateway/api/v1/orders; done

  # the counter's status, read without spending (the decision API wants the
  # filter's credential; you are 127.0.0.1 to the gateway, whatever
  # X-Forwarded-For you send)
  curl -s -H 'Authorization: Bearer $dtoken' http://$control/v1/rate-limit/status/ip:127.0.0.1/api/v1/orders

  # a token budget (LLM APIs): ~400 tokens an answer, 1,500 a minute; the fifth is refused
  for i in 1 2 3 4 5; do curl -s -o /dev/null -w '%{http_code}\n' http://$gateway/v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}]}'; done

Console: http://$control/console/  (sign in with the admin token below)
Admin API token for this run: $token  (metrics: http://$control/metrics)
Press Ctrl-C to stop.
TXT
wait "${pids[0]}"
