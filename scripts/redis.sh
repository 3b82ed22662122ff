#!/usr/bin/env bash
# Start or stop the loopback Redis that `make run` and `make bench` use.
#   scripts/redis.sh start PORT DIR [aof]   (logs in DIR/redis.log; persistence
#     off, or with "aof" an append-only file in DIR, as production runs it:
#     runtime rules, tiers, keys and the audit trail live only in Redis)
#   scripts/redis.sh stop DIR
set -euo pipefail
cmd=${1:?usage: redis.sh start PORT DIR [aof] | stop DIR}
case "$cmd" in
start)
  port=${2:?port}; dir=${3:?dir}
  command -v redis-server >/dev/null || { echo "redis-server is not installed: run 'make deps'" >&2; exit 1; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd) # redis resolves paths after it changes into --dir
  aof=no
  [ "${4:-}" = aof ] && aof=yes
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly "$aof" --appendfsync everysec --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && exit 0
    sleep 0.1
  done
  echo "redis did not start on port $port; see $dir/redis.log" >&2; exit 1
  ;;
stop)
  dir=${2:?dir}
  [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -f "$dir/redis.pid"
  ;;
*) echo "usage: redis.sh start PORT DIR [aof] | stop DIR" >&2; exit 2 ;;
esac
