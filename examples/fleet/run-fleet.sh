#!/usr/bin/env bash
# `make run-fleet`: a local multi-gateway fleet in one command — redis-server, four enginesim engines and two
# kvgate gateways sharing the Redis store (gateway 0 on :8080, gateway 1 on :8081), everything on loopback.
# Ctrl-C (SIGINT) or SIGTERM stops every process it started and exits 0. Needs redis-server on PATH and the
# binaries in BIN (the Makefile builds them). Ports are set by the environment:
#   FLEET_GATEWAY_PORT (8080; the second gateway takes the next port), FLEET_ENGINE_PORT (8001; engines take
#   4 consecutive ports), FLEET_EVENTS_PORT (5557; two per engine: events, replay), FLEET_REDIS_PORT (6390).
# The generated config and every process's log are in a temporary directory, printed at start and removed
# on exit.
set -euo pipefail
BIN=${BIN:-bin}
GW=${FLEET_GATEWAY_PORT:-8080}
EP=${FLEET_ENGINE_PORT:-8001}
EV=${FLEET_EVENTS_PORT:-5557}
RP=${FLEET_REDIS_PORT:-6390}
MODEL_DIR=${MODEL_DIR:-examples/models/qwen3}
command -v redis-server >/dev/null || { echo "run-fleet: redis-server is not on PATH (apt-get install redis-server)" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-fleet.XXXXXX")
pids=()
stop() {
  trap - INT TERM
  echo
  echo "run-fleet: stopping ${#pids[@]} processes"
  # Background jobs of a non-interactive shell ignore SIGINT, so each gets SIGTERM by its PID.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
  exit 0
}
trap stop INT TERM

# One admin token for both gateways (generated unless KVGATE_ADMIN_TOKEN is set).
export KVGATE_ADMIN_TOKEN=${KVGATE_ADMIN_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}

redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pids+=($!)

cfg="$dir/fleet.yaml"
cat >"$cfg" <<YAML
# Written by examples/fleet/run-fleet.sh: two gateways (--listen gives each its port) on one Redis.
listen: "127.0.0.1:$GW"
admin_token_env: KVGATE_ADMIN_TOKEN
store: {kind: redis, addrs: ["127.0.0.1:$RP"], index_layout: 2, reservation_layout: 2}   # a new fleet: no older gateway to share the old layouts with
store_down_limit_share: 0.5          # each of the two gateways keeps half of every limit while Redis is down
models:
  - name: qwen3
    tokenizer: $MODEL_DIR
    block_size: 16
    endpoints:
YAML
for i in 0 1 2 3; do
  port=$((EP + i)) ev=$((EV + 2 * i)) rep=$((EV + 2 * i + 1))
  "$BIN/enginesim" --model "$MODEL_DIR" --served-model-name qwen3 --host 127.0.0.1 --port "$port" \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://127.0.0.1:$ev\",\"replay_endpoint\":\"tcp://127.0.0.1:$rep\",\"topic\":\"kv@e$i@qwen3\"}" \
    >"$dir/e$i.log" 2>&1 &
  pids+=($!)
  echo "      - {id: e$i, engine: enginesim, url: \"http://127.0.0.1:$port\", kv_events: \"tcp://127.0.0.1:$ev\", kv_replay: \"tcp://127.0.0.1:$rep\", max_inflight_requests: 64, max_inflight_tokens: 262144}" >>"$cfg"
done

for g in 0 1; do
  "$BIN/kvgate" serve --config "$cfg" --listen "127.0.0.1:$((GW + g))" >"$dir/g$g.out" 2>"$dir/g$g.log" &
  pids+=($!)
done

for g in 0 1; do
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$((GW + g))/readyz" >/dev/null 2>&1 && break
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || { echo "run-fleet: a process exited; logs in $dir:" >&2; tail -n 5 "$dir"/*.log >&2; stop; }
    done
    sleep 0.1
  done
done
cat <<MSG

kvgate fleet: gateways http://127.0.0.1:$GW and http://127.0.0.1:$((GW + 1)), one Redis (127.0.0.1:$RP),
engines e0..e3 on ports $EP..$((EP + 3)). Config and logs: $dir

Send the same request through each gateway; the second lands on the same engine with cached tokens:

  curl -s http://127.0.0.1:$GW/v1/chat/completions -H 'Content-Type: application/json' -d @examples/requests/cached-chat.json -D - | grep -o -i -e 'x-kvgate-endpoint: [^[:space:]]*' -e '"cached_tokens":[0-9]*'
  curl -s http://127.0.0.1:$((GW + 1))/v1/chat/completions -H 'Content-Type: application/json' -d @examples/requests/cached-chat.json -D - | grep -o -i -e 'x-kvgate-endpoint: [^[:space:]]*' -e '"cached_tokens":[0-9]*'

Admin token: $KVGATE_ADMIN_TOKEN   Stop: Ctrl-C
MSG
wait
