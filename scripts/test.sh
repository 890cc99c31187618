#!/usr/bin/env bash
# Run corral's whole test suite on a fresh machine: installs what the tests need
# (Python deps; slurm-wlm, munge, etcd via apt), starts the Slurm test cluster,
# runs pytest (which starts Ray and etcd itself), and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v slurmctld >/dev/null || need_apt+=(slurm-wlm)
command -v munged >/dev/null || need_apt+=(munge)
command -v etcd >/dev/null || need_apt+=(etcd-server etcd-client)
if ((${#need_apt[@]})); then
    echo "[test] apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

echo "[test] pip install -e .[dev,ray,torch]"
python -m pip install -q -e ".[dev,ray,torch]" 2>&1 | grep -v -E "^(WARNING: Running pip as|WARNING: Location)" || true

export RAY_USAGE_STATS_ENABLED=0
started_slurm=0
if [ -f .ci/slurm_cluster.sh ]; then
    echo "[test] starting the Slurm test cluster"
    bash .ci/slurm_cluster.sh up
    started_slurm=1
fi
cleanup() {
    if [ "$started_slurm" = 1 ]; then bash .ci/slurm_cluster.sh down || true; fi
}
trap cleanup EXIT

python -m pytest -q -p no:cacheprovider -rfEs "$@"
