#!/usr/bin/env bash
# Run corral's whole test suite on a fresh machine: installs what the tests need
# (Python deps; slurm-wlm, munge, etcd, chromium via apt), starts the Slurm test cluster,
# runs pytest (which starts Ray and etcd itself), and stops what it started.
#
#   bash scripts/test.sh [PYTEST ARGS]     install, then test
#   bash scripts/test.sh --install-only    install only (what .ci/run does before linting)
#   bash scripts/test.sh --no-install ...  test only (everything already installed)
#   CORRAL_TEST_SEED=N bash scripts/test.sh ...  the tests in the random order of seed N
#
# A failing install step stops the run with one line naming the step and the fix.
# CORRAL_APT_PACKAGES (space separated) forces the apt list instead of probing PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=all
case "${1:-}" in
    --install-only) mode=install; shift ;;
    --no-install) mode=test; shift ;;
esac

PY=${PYTHON:-$(command -v python3 || command -v python || true)}
[ -n "$PY" ] || { echo "[test] FAILED step 'find python': no python3 or python on PATH; install Python 3.11+"; exit 1; }

# run_step NAME FIX CMD...: run CMD quietly; on failure show its output and one line
# that names the step and the fix, then stop.
run_step() {
    local name=$1 fix=$2 log
    shift 2
    log=$(mktemp)
    echo "[test] $name"
    local rc=0
    "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        grep -v -E "^(WARNING: Running pip as|WARNING: Location)" "$log" | tail -n 20 >&2 || true
        rm -f "$log"
        echo "[test] FAILED step '$name' (exit $rc): $fix" >&2
        exit 1
    fi
    rm -f "$log"
}

install() {
    local need_apt=()
    if [ -n "${CORRAL_APT_PACKAGES:-}" ]; then
        read -r -a need_apt <<<"$CORRAL_APT_PACKAGES"
    else
        command -v slurmctld >/dev/null || need_apt+=(slurm-wlm)
        command -v munged >/dev/null || need_apt+=(munge)
        command -v etcd >/dev/null || need_apt+=(etcd-server etcd-client)
        command -v chromium >/dev/null || need_apt+=(chromium)  # the dashboard's browser tests
        command -v ip >/dev/null && command -v tc >/dev/null || need_apt+=(iproute2)  # netns bench tests
    fi
    if ((${#need_apt[@]})); then
        command -v apt-get >/dev/null || {
            echo "[test] FAILED step 'apt-get install ${need_apt[*]}': apt-get not found; install ${need_apt[*]} with this system's package manager" >&2
            exit 1
        }
        run_step "apt-get update" "check the network and apt sources (/etc/apt/sources.list*)" \
            apt-get update -qq
        run_step "apt-get install ${need_apt[*]}" "check the network and apt sources, or install the packages by hand" \
            env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
    fi
    run_step "pip install -e .[dev,ray,torch,examples]" "check the network / package index (pip config list), then rerun" \
        "$PY" -m pip install -q -e ".[dev,ray,torch,examples]"
    # AReaL 1.0.4 for tests/areal_compat: the package without its GPU stack (--no-deps) and
    # the few packages its scheduler and controller modules import.
    run_step "pip install --no-deps areal==1.0.4 (tests/areal_compat/requirements.txt)" \
        "check the network / package index, then rerun; the pins are in tests/areal_compat/requirements.txt" \
        "$PY" -m pip install -q --no-deps -r tests/areal_compat/requirements.txt
    run_step "import areal's controllers" \
        "a package areal imports is missing from tests/areal_compat/requirements.txt: add its pin" \
        "$PY" -c "import areal.infra.controller.train_controller, areal.infra.controller.rollout_controller, areal.infra.scheduler.local, areal.infra.scheduler.ray, areal.infra.scheduler.slurm, areal.api.cli_args, areal.api.io_struct"
}

if [ "$mode" != test ]; then install; fi
if [ "$mode" = install ]; then exit 0; fi

export RAY_USAGE_STATS_ENABLED=0
started_slurm=0
cleanup() {
    if [ "$started_slurm" = 1 ]; then bash .ci/slurm_cluster.sh down || true; fi
}
trap cleanup EXIT
lab_conf="${CORRAL_SLURM_DIR:-/tmp/corral-slurm}/etc/slurm.conf"
if command -v scontrol >/dev/null && SLURM_CONF=$lab_conf scontrol ping 2>/dev/null | grep -q "is UP"; then
    echo "[test] using the Slurm test cluster that is already up (it stays up afterwards)"
else
    echo "[test] starting the Slurm test cluster"
    started_slurm=1
    run_step "start the Slurm test cluster (.ci/slurm_cluster.sh up)" \
        "read the lines above; bash .ci/slurm_cluster.sh status shows the daemons" \
        bash .ci/slurm_cluster.sh up
fi

# Random test order (pytest-randomly, dev extra): a test that passes only after (or before)
# another is a bug. The seed is printed first and last; CORRAL_TEST_SEED=N replays an order.
seed=${CORRAL_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
replay="replay this order: CORRAL_TEST_SEED=$seed bash scripts/test.sh --no-install ${*:-}"
echo "[test] random test order, seed $seed ($replay)"
rc=0
"$PY" -m pytest -q -p no:cacheprovider -rfEs --durations=25 -p randomly --randomly-seed="$seed" "$@" || rc=$?
echo "[test] random test order, seed $seed ($replay)"
exit "$rc"
