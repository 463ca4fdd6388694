#!/usr/bin/env bash
# Loopback services for the release integration tests.
#
#   .ci/services.sh start   start both, write .ci/services.env (source it; tests also read it)
#   .ci/services.sh stop    stop both and delete their state
#
# 1. Debian's docker-registry (distribution v2.8) on 127.0.0.1:<free port>, temporary root, deletes on.
# 2. podman's Docker-API socket (vfs storage, cgroupfs, file events) with that registry listed as
#    insecure, so the docker SDK can build images and push them over plain HTTP.
# Needs: apt-get install -y docker-registry podman buildah skopeo uidmap (run as root).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ENV_FILE="$ROOT/.ci/services.env"

die() { echo "services.sh: $*" >&2; exit 1; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  echo "services.sh: $what is up"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  command -v docker-registry >/dev/null || die "docker-registry missing: apt-get install -y docker-registry"
  command -v podman >/dev/null || die "podman missing: apt-get install -y podman buildah skopeo uidmap"
  [ -f "$ENV_FILE" ] && stop
  local state port
  state=$(mktemp -d /tmp/qwen3-tts-services.XXXXXX)
  port=$(free_port)

  cat >"$state/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $state/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
  setsid docker-registry serve "$state/registry.yml" >"$state/registry.log" 2>&1 </dev/null &
  echo $! >"$state/registry.pid"

  cat >"$state/registries.conf" <<EOF
unqualified-search-registries = []

[[registry]]
location = "127.0.0.1:$port"
insecure = true
EOF
  mkdir -p "$state/podman"
  CONTAINERS_REGISTRIES_CONF="$state/registries.conf" setsid podman \
    --root "$state/podman/root" --runroot "$state/podman/run" --tmpdir "$state/podman/tmp" \
    --storage-driver vfs --cgroup-manager cgroupfs --events-backend file \
    system service --time=0 "unix://$state/podman.sock" >"$state/podman.log" 2>&1 </dev/null &
  echo $! >"$state/podman.pid"

  cat >"$ENV_FILE" <<EOF
export QWEN3_TTS_SERVICES_DIR=$state
export QWEN3_TTS_TEST_REGISTRY=127.0.0.1:$port
export QWEN3_TTS_TEST_DOCKER_HOST=unix://$state/podman.sock
export DOCKER_HOST=unix://$state/podman.sock
EOF
  wait_for 20 "docker-registry on 127.0.0.1:$port" curl -fsS "http://127.0.0.1:$port/v2/" \
    || { cat "$state/registry.log" >&2; stop; die "docker-registry did not start"; }
  wait_for 60 "podman socket $state/podman.sock" curl -fsS --unix-socket "$state/podman.sock" http://d/_ping \
    || { cat "$state/podman.log" >&2; stop; die "podman system service did not start"; }
  echo "services.sh: wrote $ENV_FILE"
}

stop() {
  [ -f "$ENV_FILE" ] || { echo "services.sh: nothing to stop"; return 0; }
  local state
  state=$(sed -n 's/^export QWEN3_TTS_SERVICES_DIR=//p' "$ENV_FILE")
  if [ -n "$state" ] && [ -d "$state" ]; then
    for name in podman registry; do
      if [ -f "$state/$name.pid" ]; then
        local pid
        pid=$(cat "$state/$name.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
    done
    case "$state" in /tmp/qwen3-tts-services.*) rm -rf "$state" ;; esac
  fi
  rm -f "$ENV_FILE"
  echo "services.sh: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
