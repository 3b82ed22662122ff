#!/usr/bin/env bash
# `make run`: Redis and the control service on loopback, with curl commands to
# try. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
run=.run
redis_port=${TOLLGATE_RUN_REDIS_PORT:-6390}
listen=${TOLLGATE_LISTEN:-127.0.0.1:8081}
token=${TOLLGATE_ADMIN_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
mkdir -p "$run"

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
trap cleanup INT TERM EXIT

scripts/redis.sh start "$redis_port" "$run"
TOLLGATE_LISTEN=$listen TOLLGATE_REDIS_URL=redis://127.0.0.1:$redis_port/0 TOLLGATE_ADMIN_TOKEN=$token \
  bin/controlsvc -config controlsvc/tollgate.example.toml >"$run/controlsvc.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -fs "http://$listen/health" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "controlsvc exited:"; tail -5 "$run/controlsvc.log"; exit 1; }
  sleep 0.1
done

cat <<TXT

Tollgate control service on http://$listen (Redis on 127.0.0.1:$redis_port, logs in $run/)
The demo's free tier allows 5 requests a minute.

  # allowed, with X-RateLimit-* headers
  curl -i -X POST http://$listen/v1/rate-limit/check -d '{"user_id":"alice","endpoint":"/api/v1/items"}'

  # run it six times: the sixth answers 429 with Retry-After and RATE_LIMIT_EXCEEDED
  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' -X POST http://$listen/v1/rate-limit/check -d '{"user_id":"bob","endpoint":"/api/v1/items"}'; done

  # the counter's status, read without spending
  curl -s http://$listen/v1/rate-limit/status/bob/api/v1/items

Admin API token for this run: $token  (metrics: http://$listen/metrics)
Press Ctrl-C to stop.
TXT
wait "${pids[0]}"
