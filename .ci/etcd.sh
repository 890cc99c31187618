#!/usr/bin/env bash
# Run one throw-away etcd on loopback for tests.
#
#   .ci/etcd.sh install   apt-get install etcd-server etcd-client if `etcd` is missing
#   .ci/etcd.sh start     start etcd (if not already running), wait until healthy, print host:port
#   .ci/etcd.sh stop      stop the etcd started by `start` (by its PID file)
#   .ci/etcd.sh status    print host:port and exit 0 if it is running and healthy
#   .ci/etcd.sh clean     stop it and delete its data dir (data survives stop/start otherwise)
#
# Settings (environment):
#   CORRAL_ETCD_DIR          data dir, PID file and log        (default /tmp/corral-etcd)
#   CORRAL_ETCD_CLIENT_PORT  client port                       (default 23790)
#   CORRAL_ETCD_PEER_PORT    peer port                         (default 23800)
#   CORRAL_ETCD_START_WAIT   seconds to wait for health        (default 20)
set -euo pipefail

DIR="${CORRAL_ETCD_DIR:-/tmp/corral-etcd}"
CLIENT_PORT="${CORRAL_ETCD_CLIENT_PORT:-23790}"
PEER_PORT="${CORRAL_ETCD_PEER_PORT:-23800}"
START_WAIT="${CORRAL_ETCD_START_WAIT:-20}"
HOST="127.0.0.1"
ADDR="${HOST}:${CLIENT_PORT}"
PID_FILE="${DIR}/etcd.pid"
LOG_FILE="${DIR}/etcd.log"

die() {
    echo "etcd.sh: $*" >&2
    exit 1
}

running_pid() {
    # Print the PID from the PID file if that process is alive.
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

healthy() {
    # etcd's /health answers {"health":"true",...} once it serves requests.
    local body
    body="$(curl -fsS --max-time 2 "http://${ADDR}/health" 2>/dev/null)" || return 1
    [[ "$body" == *'"health":"true"'* ]]
}

cmd_install() {
    if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
        echo "etcd already installed: $(etcd --version | head -n1)"
        return 0
    fi
    local sudo=""
    if [[ "$(id -u)" != "0" ]]; then
        sudo="sudo"
    fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q etcd-server etcd-client
    etcd --version | head -n1
}

cmd_start() {
    command -v etcd >/dev/null 2>&1 || die "etcd is not installed; run '$0 install'"
    command -v curl >/dev/null 2>&1 || die "curl is needed to check etcd's health; install it"
    mkdir -p "$DIR"
    if running_pid >/dev/null; then
        if healthy; then
            echo "$ADDR"
            return 0
        fi
    else
        if healthy; then
            die "something else already serves etcd on ${ADDR}; stop it or set CORRAL_ETCD_CLIENT_PORT"
        fi
        # setsid: etcd must not die with the shell (or pytest) that started it, only on `stop`.
        setsid etcd \
            --name corral-test \
            --data-dir "${DIR}/data" \
            --listen-client-urls "http://${ADDR}" \
            --advertise-client-urls "http://${ADDR}" \
            --listen-peer-urls "http://${HOST}:${PEER_PORT}" \
            --initial-advertise-peer-urls "http://${HOST}:${PEER_PORT}" \
            --initial-cluster "corral-test=http://${HOST}:${PEER_PORT}" \
            --initial-cluster-state new \
            --logger zap --log-outputs stderr --log-level warn \
            >"$LOG_FILE" 2>&1 </dev/null &
        echo $! >"$PID_FILE"
    fi
    local waited=0
    while ! healthy; do
        if ! running_pid >/dev/null; then
            echo "etcd.sh: etcd exited while starting; last lines of ${LOG_FILE}:" >&2
            tail -n 20 "$LOG_FILE" >&2 || true
            rm -f "$PID_FILE"
            exit 1
        fi
        if ((waited >= START_WAIT * 10)); then
            echo "etcd.sh: etcd on ${ADDR} not healthy after ${START_WAIT}s; log: ${LOG_FILE}" >&2
            tail -n 20 "$LOG_FILE" >&2 || true
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    echo "$ADDR"
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        echo "etcd.sh: no etcd running from ${PID_FILE}"
        return 0
    fi
    kill -TERM "$pid"
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
    echo "etcd.sh: stopped etcd (pid ${pid})"
}

cmd_status() {
    running_pid >/dev/null || die "not running (no live PID in ${PID_FILE})"
    healthy || die "running but not healthy on ${ADDR}"
    echo "$ADDR"
}

cmd_clean() {
    cmd_stop
    rm -rf "$DIR"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
clean) cmd_clean ;;
*)
    echo "usage: $0 {install|start|stop|status|clean}" >&2
    exit 2
    ;;
esac
