#!/usr/bin/env bash
# Installs (Debian's docker.io) and starts a private Docker daemon for local image builds and the container
# rehearsal, on a socket of its own so it never touches a daemon the machine already runs.
#   eval "$(scripts/container-runtime.sh)"   # exports DOCKER_HOST (the private socket) and DOCKER (a client that builds)
#   scripts/container-runtime.sh --stop     # stops the daemon this script started
# The daemon runs without a bridge or iptables rules (--bridge=none): containers use the host's network or none.
# Needs root (apt-get, dockerd). Idempotent: a daemon already answering on the socket is reused.
set -euo pipefail
STATE=${ASYNCRL_DOCKER_STATE:-/var/lib/asyncrl-docker}
RUN_DIR=${ASYNCRL_DOCKER_RUN:-/run/asyncrl-docker}
SOCK="unix://$RUN_DIR/docker.sock"

if [[ "${1:-}" == "--stop" ]]; then
  if [[ -f "$RUN_DIR/dockerd.pid" ]]; then kill "$(cat "$RUN_DIR/dockerd.pid")" 2>/dev/null || true; fi
  exit 0
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if ((${#need[@]})); then
  echo "container-runtime: installing ${need[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

mkdir -p "$STATE" "$RUN_DIR"
if ! docker -H "$SOCK" info >/dev/null 2>&1; then
  nohup dockerd --host "$SOCK" --data-root "$STATE/data" --exec-root "$RUN_DIR/exec" --pidfile "$RUN_DIR/dockerd.pid" \
    --bridge=none --iptables=false --ip6tables=false >"$STATE/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    docker -H "$SOCK" info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker -H "$SOCK" info >/dev/null 2>&1 || { echo "container-runtime: dockerd did not answer on $SOCK in 30 s; see $STATE/dockerd.log" >&2; exit 1; }
fi
# A client that builds with BuildKit: one with buildx, else Debian's classic client (Docker 20.10), whose daemon
# embeds BuildKit. A newer client without buildx refuses DOCKER_BUILDKIT=1.
client=docker
if ! docker buildx version >/dev/null 2>&1 && [[ -x /usr/bin/docker ]]; then client=/usr/bin/docker; fi
echo "export DOCKER_HOST=$SOCK DOCKER=$client"
