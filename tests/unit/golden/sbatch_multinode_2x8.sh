#!/bin/bash
#SBATCH --job-name=demo_run1_server
#SBATCH --output=/shared/corral/demo/run1/logs/server.sbatch.log
#SBATCH --error=/shared/corral/demo/run1/logs/server.sbatch.log
#SBATCH --open-mode=append
#SBATCH --nodes=4
#SBATCH --ntasks=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --gres=gpu:8
#SBATCH --no-requeue
# corral role server: 2 replica(s) x (cpu=16, gpu=16, mem=64G) on 4 node(s), container=none
set -u
export CORRAL_EXPERIMENT=demo
export CORRAL_TRIAL=run1
export CORRAL_ROLE=server
export CORRAL_NAME_RESOLVE='{"root": "/shared/corral/name_resolve", "type": "files"}'
export CORRAL_SECRET_FILE=/shared/corral/demo/run1/.secret
export CORRAL_INDEX_OFFSET=0
export CORRAL_LEASE_TIMEOUT=5.0
export CORRAL_PORT_COUNT=2
export CORRAL_LOG_DIR=/shared/corral/demo/run1/logs
export CORRAL_BACKEND_ID="${SLURM_JOB_ID:-}"
srun --ntasks=4 --ntasks-per-node=1 --cpus-per-task=8 --kill-on-bad-exit=1 --unbuffered \
    bash -c 'set -u
export PYTHONUNBUFFERED=1
corral_rank=$(( ${SLURM_PROCID:-0} % 2 ))
corral_index=$(( ${CORRAL_INDEX_OFFSET:-0} + ${SLURM_PROCID:-0} / 2 ))
corral_role=server
corral_dir=/shared/corral/demo/run1/logs/server
if (( corral_rank > 0 )); then  # a member, on node corral_rank of the instance
    corral_role=server.members
    corral_dir=/shared/corral/demo/run1/logs/server.members
    corral_index=$(( corral_index * 1 + corral_rank - 1 ))
    export CORRAL_ROLE="$corral_role"
fi
export CORRAL_INDEX="$corral_index"
export CORRAL_NNODES=2 CORRAL_NODE_RANK="$corral_rank"
export CORRAL_NODE="${SLURMD_NODENAME:-$(hostname)}"
corral_gpus=8
corral_first=$(( ${SLURM_LOCALID:-0} * corral_gpus ))
IFS=, read -r -a corral_alloc <<< "${CUDA_VISIBLE_DEVICES:-}"
corral_devices=""
for (( corral_i = corral_first; corral_i < corral_first + corral_gpus; corral_i++ )); do
    if (( ${#corral_alloc[@]} >= corral_first + corral_gpus )); then
        corral_devices+="${corral_devices:+,}${corral_alloc[corral_i]}"
    else
        corral_devices+="${corral_devices:+,}${corral_i}"
    fi
done
export CUDA_VISIBLE_DEVICES="$corral_devices"
export ASCEND_RT_VISIBLE_DEVICES="$corral_devices"
corral_prefix="[${corral_role}/${corral_index}] "
corral_log="$corral_dir"/${corral_index}.log
corral_exit="$corral_dir"/${corral_index}${SLURM_JOB_ID:+.$SLURM_JOB_ID}.exit
mkdir -p "$corral_dir"
rm -f "$corral_exit" "$corral_exit.pid" "$corral_exit.rc"
printf "%s\n" "${SLURMD_NODENAME:-$(hostname)}" > "$corral_dir/${corral_index}.node"
exec 3> >(sed -u "s|^|${corral_prefix}|" >> /shared/corral/demo/run1/logs/server.log)
corral_sed=$!
corral_pidf="$corral_exit.pid"
trap '"'"'kill -TERM "$(cat "$corral_pidf" 2>/dev/null)" 2>/dev/null'"'"' TERM
{ /opt/venv/bin/python -m corral.worker 3>&- 2>&1 & printf "%s\n" "$!" > "$corral_pidf"; wait "$!"; printf "%s\n" "$?" > "$corral_exit.rc"; } \
    | tee -a "$corral_log" /dev/fd/3 \
    | sed -u "s|^|${corral_prefix}|" >> /shared/corral/demo/run1/logs/merged.log &
corral_pipe=$!
until wait "$corral_pipe"; do kill -0 "$corral_pipe" 2>/dev/null || break; done
corral_rc=$(cat "$corral_exit.rc" 2>/dev/null || echo 1)
rm -f "$corral_exit.rc" "$corral_pidf"
printf "%s\n" "$corral_rc" > "$corral_exit.tmp" && mv -f "$corral_exit.tmp" "$corral_exit"
exec 3>&-
wait "$corral_sed" 2>/dev/null || true
exit "$corral_rc"
'
