#!/usr/bin/env bash
# =============================================================================
# .ci/slurm_cluster.sh -- a real Slurm 22.05 test cluster on ONE machine.
#
#   bash .ci/slurm_cluster.sh up      install (apt, if missing) + start + warm up
#   bash .ci/slurm_cluster.sh down    cancel jobs, stop everything by PID, clean up
#   bash .ci/slurm_cluster.sh status  daemons + sinfo
#   bash .ci/slurm_cluster.sh check   quick self-test of a running cluster
#   bash .ci/slurm_cluster.sh env     print the exports (same as $LAB/env)
#
# Layout: one slurmctld and NODES slurmd daemons in Slurm's "multiple slurmd"
# mode (`slurmd -N nodeN`, one Port= per node). Every slurmd lives in its own
# UTS namespace, so `hostname` inside a job prints nodeN; node N is reachable
# at 127.0.1.N (a marked block in /etc/hosts). Each node advertises CPUS CPUs
# (SlurmdParameters=config_overrides lets it claim more than the machine has)
# and GPUS GPUs (gres/gpu, backed by char devices with major 195 made under
# $LAB/dev -- Slurm drops file-less GPUs and rejects regular files).
#
# Needs root and Debian/Ubuntu (apt). Designed for machines without systemd.
# All state lives under $LAB except: the apt packages, the /etc/hosts block,
# the /etc/slurm/slurm.conf symlink (only if that path is free or already a
# symlink), the process-tracking cgroup and Slurm's own slurm_nodeN cgroups.
#
# Every process the cluster starts (daemons, slurmstepd, job tasks) runs in a
# cgroup-v1 "pids" group used only for bookkeeping, so `down` can find and
# kill leftovers by PID. Without that hierarchy it falls back to pid files
# plus a scan for a marker variable in the daemons' environment.
#
# Environment (all optional):
#   CORRAL_SLURM_DIR=/tmp/corral-slurm   lab directory
#   CORRAL_SLURM_NODES=4  CORRAL_SLURM_CPUS=16  CORRAL_SLURM_GPUS=4
#   CORRAL_SLURM_MEM_MB=131072           RealMemory advertised per node
#   CORRAL_SLURM_CTLD_PORT=16917  CORRAL_SLURM_NODE_PORT_BASE=17100 (node N: base+N)
#   CORRAL_SLURM_PROCTRACK=auto|cgroup|linuxproc|pgid   (auto: cgroup if the
#                                        v1 freezer hierarchy works, else linuxproc)
#   CORRAL_SLURM_KILLWAIT=3  CORRAL_SLURM_SLURMD_TIMEOUT=10  CORRAL_SLURM_MINJOBAGE=300
#   CORRAL_SLURM_KEEP=1     `up` leaves a healthy running cluster alone
#   CORRAL_SLURM_WARMUP=0   skip the warm-up batch job
#   CORRAL_SLURM_ETC_LINK=0 do not symlink /etc/slurm/slurm.conf
# =============================================================================
set -euo pipefail

LAB=${CORRAL_SLURM_DIR:-/tmp/corral-slurm}
NODES=${CORRAL_SLURM_NODES:-4}
CPUS=${CORRAL_SLURM_CPUS:-16}
GPUS=${CORRAL_SLURM_GPUS:-4}
MEM_MB=${CORRAL_SLURM_MEM_MB:-131072}
CTLD_PORT=${CORRAL_SLURM_CTLD_PORT:-16917}
NODE_PORT_BASE=${CORRAL_SLURM_NODE_PORT_BASE:-17100}
PROCTRACK_WANTED=${CORRAL_SLURM_PROCTRACK:-auto}
KILLWAIT=${CORRAL_SLURM_KILLWAIT:-3}
SLURMD_TIMEOUT=${CORRAL_SLURM_SLURMD_TIMEOUT:-10}
MINJOBAGE=${CORRAL_SLURM_MINJOBAGE:-300}
KEEP=${CORRAL_SLURM_KEEP:-0}
WARMUP=${CORRAL_SLURM_WARMUP:-1}
ETC_LINK=${CORRAL_SLURM_ETC_LINK:-1}

CONF="$LAB/etc/slurm.conf"
SOCK="$LAB/run/munge/munge.socket.2"
# bookkeeping cgroup; the name is derived from the lab dir so two labs never share one
TRACK_CG="/sys/fs/cgroup/pids/corral-slurm-$(printf '%s' "$LAB" | cksum | cut -d' ' -f1)"
HOSTS_BEGIN="# BEGIN corral-slurm $LAB"
HOSTS_END="# END corral-slurm $LAB"
MARKER="CORRAL_SLURM_LAB=$LAB"

export SLURM_CONF="$CONF"

say() { printf '[slurm_cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
fail() { say "ERROR: $*"; exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# ----------------------------------------------------------- process helpers
# True if the PID exists and is not a zombie (PID 1 here may reap slowly).
pid_alive() {
    local pid=${1:-} state
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$pid/status" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# SIGTERM, wait up to $2 seconds, then SIGKILL.
terminate_pid() {
    local pid=$1 grace=${2:-10} n
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((n = 0; n < grace * 10; n++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    say "pid $pid still alive ${grace}s after SIGTERM: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

terminate_pidfile() {
    local file=$1 grace=${2:-10}
    [ -f "$file" ] || return 0
    terminate_pid "$(cat "$file" 2>/dev/null || true)" "$grace"
    rm -f "$file"
}

# PIDs started by this lab: the tracking cgroup if present, else the marker scan.
lab_pids() {
    if [ -r "$TRACK_CG/cgroup.procs" ]; then
        cat "$TRACK_CG/cgroup.procs"
        return 0
    fi
    local d
    for d in /proc/[0-9]*; do
        { tr '\0' '\n' <"$d/environ"; } 2>/dev/null | grep -qxF "$MARKER" && echo "${d#/proc/}"
    done
    return 0
}

# Run "$@" as a tracked process (inherited by all descendants). Every descriptor above 2
# is closed first: a daemon must not keep a caller's file open, above all the fd of
# `flock /tmp/corral-slurm.lock ...`, which munged otherwise holds (and so the lock) for
# as long as it runs.
tracked() {
    (
        if [ -w "$TRACK_CG/cgroup.procs" ]; then echo "$BASHPID" >"$TRACK_CG/cgroup.procs"; fi
        export "$MARKER"
        local fd
        for fd in $(ls /proc/$BASHPID/fd); do
            if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
        done
        exec "$@"
    )
}

# ----------------------------------------------------------------- install --
install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null || fail "slurm is not installed and apt-get is missing"
    say "installing slurm-wlm and munge with apt"
    apt-get update -qq
    # without recommends: a handful of packages instead of dozens of plugins
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
}

# --------------------------------------------------------------- proctrack --
# proctrack/cgroup (v1) kills every process of a job on scancel, double-forked
# ones included; it needs the v1 freezer hierarchy to be usable.
cgroup_v1_usable() {
    local fs probe
    fs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null) || return 1
    [ "$fs" = tmpfs ] || return 1
    grep -qE '^[^ ]+ /sys/fs/cgroup/freezer cgroup ' /proc/mounts || return 1
    probe="/sys/fs/cgroup/freezer/corral-probe-$$"
    mkdir "$probe" 2>/dev/null || return 1
    rmdir "$probe" 2>/dev/null || true
    return 0
}

choose_proctrack() {
    case "$PROCTRACK_WANTED" in
    auto) if cgroup_v1_usable; then echo cgroup; else echo linuxproc; fi ;;
    cgroup | linuxproc | pgid) echo "$PROCTRACK_WANTED" ;;
    *) fail "CORRAL_SLURM_PROCTRACK=$PROCTRACK_WANTED: use auto, cgroup, linuxproc or pgid" ;;
    esac
}

# ------------------------------------------------------------------ config --
write_config() {
    local proctrack=$1 n gres=""
    mkdir -p "$LAB"/{etc,run/munge,log,spool/ctld,spool/nodes,dev,munge}
    chmod 0700 "$LAB/munge"
    chmod 0755 "$LAB/run/munge"

    if ((GPUS > 0)); then
        for ((n = 0; n < GPUS; n++)); do
            [ -c "$LAB/dev/nvidia$n" ] || mknod -m 0666 "$LAB/dev/nvidia$n" c 195 "$n"
        done
        gres="Gres=gpu:$GPUS"
        printf 'NodeName=node[1-%d] Name=gpu File=%s/dev/nvidia[0-%d]\n' \
            "$NODES" "$LAB" "$((GPUS - 1))" >"$LAB/etc/gres.conf"
    else
        : >"$LAB/etc/gres.conf"
    fi

    {
        echo "# generated by .ci/slurm_cluster.sh -- single-machine test cluster"
        echo "ClusterName=corral"
        # slurmctld only starts if its own short hostname is the controller
        echo "SlurmctldHost=$(hostname -s)(127.0.0.1)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmdPort=$NODE_PORT_BASE"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$SOCK"
        echo "CredType=cred/munge"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$LAB/spool/ctld"
        echo "SlurmdSpoolDir=$LAB/spool/nodes/%n"
        echo "SlurmctldPidFile=$LAB/run/slurmctld.pid"
        echo "SlurmdPidFile=$LAB/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$LAB/log/slurmctld.log"
        echo "SlurmdLogFile=$LAB/log/slurmd-%n.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        echo "MailProg=/bin/true"
        echo "ProctrackType=proctrack/$proctrack"
        echo "TaskPlugin=task/none"
        echo "MpiDefault=none"
        echo "SwitchType=switch/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "SchedulerType=sched/backfill"
        # the default batch_sched_delay=3 holds new batch jobs back ~3 s
        echo "SchedulerParameters=batch_sched_delay=0"
        # no slurmdbd (no sacct): finished jobs stay in scontrol/squeue -t all
        # for MinJobAge seconds; jobcomp/filetxt keeps one line per finished job
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "JobCompType=jobcomp/filetxt"
        echo "JobCompLoc=$LAB/log/jobcomp.txt"
        echo "MinJobAge=$MINJOBAGE"
        echo "KillWait=$KILLWAIT"
        echo "SlurmdTimeout=$SLURMD_TIMEOUT"
        echo "ReturnToService=2"
        echo "InactiveLimit=0"
        echo "SlurmdParameters=config_overrides"
        echo "GresTypes=gpu"
        for ((n = 1; n <= NODES; n++)); do
            echo "NodeName=node$n NodeHostname=node$n NodeAddr=127.0.1.$n Port=$((NODE_PORT_BASE + n)) CPUs=$CPUS RealMemory=$MEM_MB $gres State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF"

    if [ "$proctrack" = cgroup ]; then
        {
            echo "CgroupPlugin=cgroup/v1"
            echo "ConstrainCores=no"
            echo "ConstrainRAMSpace=no"
            echo "ConstrainDevices=no"
        } >"$LAB/etc/cgroup.conf"
    else
        rm -f "$LAB/etc/cgroup.conf"
    fi

    {
        echo "export SLURM_CONF=$CONF"
        echo "export CORRAL_SLURM_DIR=$LAB"
        echo "export CORRAL_SLURM_NODES=$NODES"
        echo "export CORRAL_SLURM_CPUS_PER_NODE=$CPUS"
        echo "export CORRAL_SLURM_GPUS_PER_NODE=$GPUS"
    } >"$LAB/env"

    if [ "$ETC_LINK" = 1 ]; then
        mkdir -p /etc/slurm
        if [ -L /etc/slurm/slurm.conf ] || [ ! -e /etc/slurm/slurm.conf ]; then
            ln -sfn "$CONF" /etc/slurm/slurm.conf
        else
            say "WARNING: /etc/slurm/slurm.conf is a regular file, left alone: source $LAB/env"
        fi
    fi
}

# ---------------------------------------------------------------- /etc/hosts
hosts_remove() {
    grep -qxF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
    local kept
    kept=$(awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" \
        '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' /etc/hosts)
    # rewrite in place: /etc/hosts may be a bind mount that cannot be replaced
    printf '%s\n' "$kept" >/etc/hosts
}

hosts_add() {
    local n
    hosts_remove
    {
        echo "$HOSTS_BEGIN"
        for ((n = 1; n <= NODES; n++)); do echo "127.0.1.$n node$n"; done
        echo "$HOSTS_END"
    } >>/etc/hosts
}

# ------------------------------------------------------------------ daemons --
start_munged() {
    local n
    if [ ! -s "$LAB/munge/munge.key" ]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --bits=1024 --keyfile="$LAB/munge/munge.key"
        else
            dd if=/dev/urandom of="$LAB/munge/munge.key" bs=128 count=1 status=none
        fi
    fi
    chmod 0400 "$LAB/munge/munge.key"
    tracked munged --key-file="$LAB/munge/munge.key" --socket="$SOCK" \
        --pid-file="$LAB/run/munge/munged.pid" --log-file="$LAB/log/munged.log" \
        --seed-file="$LAB/munge/munged.seed" || return 1
    for ((n = 0; n < 100; n++)); do
        if munge -S "$SOCK" -n 2>/dev/null | unmunge -S "$SOCK" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    say "munged is not answering (see $LAB/log/munged.log)"
    return 1
}

start_slurmctld() {
    local n
    tracked slurmctld -c || return 1 # -c: cold start, ignore saved state
    for ((n = 0; n < 150; n++)); do
        if scontrol ping 2>/dev/null | grep -q 'is UP'; then return 0; fi
        sleep 0.1
    done
    say "slurmctld is not answering (see $LAB/log/slurmctld.log)"
    return 1
}

start_slurmd() {
    local node=node$1
    mkdir -p "$LAB/spool/nodes/$node"
    # a private UTS namespace per node: jobs there see `hostname` = nodeN;
    # the daemonised slurmd (and its slurmstepds) stay in that namespace
    tracked unshare --uts -- sh -c 'hostname "$1" && exec slurmd -N "$1"' sh "$node"
}

wait_idle() {
    local timeout_s=$1 n idle
    for ((n = 0; n < timeout_s * 10; n++)); do
        idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
        [ "$idle" -eq "$NODES" ] && return 0
        sleep 0.1
    done
    sinfo -N -l >&2 || true
    say "not all $NODES nodes idle after ${timeout_s}s (see $LAB/log/)"
    return 1
}

slurmds_alive() {
    local n
    for ((n = 1; n <= NODES; n++)); do
        pid_alive "$(cat "$LAB/run/slurmd-node$n.pid" 2>/dev/null)" || return 1
    done
}

healthy() {
    pid_alive "$(cat "$LAB/run/munge/munged.pid" 2>/dev/null)" || return 1
    pid_alive "$(cat "$LAB/run/slurmctld.pid" 2>/dev/null)" || return 1
    slurmds_alive || return 1
    scontrol ping 2>/dev/null | grep -q 'is UP'
}

# Wait until job $1 reaches state $2 (bounded by $3 seconds).
wait_state() {
    local job=$1 want=$2 timeout_s=$3 n state=""
    for ((n = 0; n < timeout_s * 10; n++)); do
        state=$(squeue -h -t all -j "$job" -o %T 2>/dev/null || true)
        [ "$state" = "$want" ] && return 0
        sleep 0.1
    done
    say "job $job is ${state:-gone}, expected $want"
    return 1
}

# One attempt at bringing everything up; returns non-zero on failure.
start_all() {
    local proctrack=$1 n t
    rm -rf "$LAB/spool" "$LAB/log" "$LAB/run"
    write_config "$proctrack"
    echo "$proctrack" >"$LAB/run/proctrack"
    hosts_add
    if [ -d /sys/fs/cgroup/pids ]; then mkdir -p "$TRACK_CG" 2>/dev/null || true; fi

    t=$(now_ms)
    start_munged || return 1
    T_MUNGE=$(($(now_ms) - t))
    t=$(now_ms)
    start_slurmctld || return 1
    T_CTLD=$(($(now_ms) - t))
    t=$(now_ms)
    for ((n = 1; n <= NODES; n++)); do start_slurmd "$n" || return 1; done
    sleep 0.3
    slurmds_alive || {
        say "a slurmd died at start (proctrack/$proctrack); see $LAB/log/slurmd-node*.log"
        return 1
    }
    wait_idle 60 || return 1
    T_NODES=$(($(now_ms) - t))

    T_WARMUP=0
    if [ "$WARMUP" = 1 ]; then
        # the first batch job after slurmctld starts waits ~3 s; pay it here.
        # Poll instead of `sbatch --wait` (its backoff makes it take ~10 s).
        local job
        t=$(now_ms)
        job=$(sbatch --parsable -o /dev/null -J corral-warmup --wrap true) || return 1
        wait_state "$job" COMPLETED 60 || return 1
        T_WARMUP=$(($(now_ms) - t))
    fi
}

# --------------------------------------------------------------------- down --
cmd_down() {
    local quiet=${1:-} f jobs n d left p
    if pid_alive "$(cat "$LAB/run/slurmctld.pid" 2>/dev/null)"; then
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            [ -n "$quiet" ] || say "cancelling jobs: $(echo $jobs)"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for ((n = 0; n < (KILLWAIT + 15) * 10; n++)); do
                [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
                sleep 0.1
            done
        fi
    fi
    # daemons by PID: slurmd first, then slurmctld, munged last
    for f in "$LAB"/run/slurmd-*.pid; do
        [ -e "$f" ] && terminate_pidfile "$f" 10
    done
    terminate_pidfile "$LAB/run/slurmctld.pid" 15
    terminate_pidfile "$LAB/run/munge/munged.pid" 5
    # leftovers (orphaned slurmstepd, tasks that escaped proctrack) by PID
    left=$(lab_pids | grep -vx "$$" || true)
    if [ -n "$left" ]; then
        say "killing leftover processes: $(echo $left)"
        for p in $left; do kill -KILL "$p" 2>/dev/null || true; done
        for p in $left; do
            for ((n = 0; n < 30; n++)); do
                pid_alive "$p" || break
                sleep 0.1
            done
        done
    fi
    [ -d "$TRACK_CG" ] && { rmdir "$TRACK_CG" 2>/dev/null || true; }
    # empty per-node cgroups that proctrack/cgroup created (slurm_nodeN/...)
    for ((n = 1; n <= NODES; n++)); do
        for d in /sys/fs/cgroup/*/slurm_node$n; do
            [ -d "$d" ] && { find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
        done
    done
    hosts_remove
    if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
        rm -f /etc/slurm/slurm.conf
    fi
    [ -n "$quiet" ] || say "down"
}

# ----------------------------------------------------------------------- up --
cmd_up() {
    local t0 t proctrack
    t0=$(now_ms)
    install_packages
    T_INSTALL=$(($(now_ms) - t0))
    if [ "$KEEP" = 1 ] && healthy; then
        say "cluster already up and healthy (CORRAL_SLURM_KEEP=1)"
        return 0
    fi
    cmd_down quiet
    proctrack=$(choose_proctrack)
    if ! start_all "$proctrack"; then
        if [ "$PROCTRACK_WANTED" = auto ] && [ "$proctrack" != linuxproc ]; then
            say "start with proctrack/$proctrack failed: retrying with proctrack/linuxproc"
            cmd_down quiet
            proctrack=linuxproc
            start_all "$proctrack" || { cmd_down quiet; fail "cluster did not start"; }
        else
            cmd_down quiet
            fail "cluster did not start"
        fi
    fi
    t=$(($(now_ms) - t0))
    say "up: $NODES nodes x $CPUS CPUs x $GPUS GPUs, proctrack/$proctrack, conf $CONF"
    say "timings (ms): install-check=$T_INSTALL munged=$T_MUNGE slurmctld=$T_CTLD" \
        "nodes-idle=$T_NODES warmup-job=$T_WARMUP total=$t"
    echo "install_check_ms=$T_INSTALL munged_ms=$T_MUNGE slurmctld_ms=$T_CTLD nodes_idle_ms=$T_NODES warmup_job_ms=$T_WARMUP total_ms=$t" \
        >"$LAB/timings"
    say "client shells: source $LAB/env"
}

# ------------------------------------------------------------------- status --
cmd_status() {
    local f n
    echo "lab: $LAB  conf: $CONF  proctrack: $(cat "$LAB/run/proctrack" 2>/dev/null || echo '?')"
    for f in "$LAB/run/munge/munged.pid" "$LAB/run/slurmctld.pid" "$LAB"/run/slurmd-*.pid; do
        [ -e "$f" ] || continue
        if pid_alive "$(cat "$f")"; then
            echo "UP    pid $(cat "$f")  $(basename "$f" .pid)"
        else
            echo "DEAD  $(basename "$f" .pid)"
        fi
    done
    n=$(lab_pids | wc -l)
    echo "tracked processes: $n"
    if pid_alive "$(cat "$LAB/run/slurmctld.pid" 2>/dev/null)"; then
        scontrol ping 2>/dev/null || true
        sinfo -N -o '%N %T %c %m %G' 2>/dev/null || true
        squeue 2>/dev/null || true
    else
        echo "slurmctld is not running"
    fi
}

# -------------------------------------------------------------------- check --
# Quick self-test of a running cluster: multi-node GPU job, an impossible GPU
# request, and scancel leaving no process behind. Exit code = failures.
cmd_check() {
    local w="$LAB/check" fails=0 job out hosts reason n before after t
    rm -rf "$w"
    mkdir -p "$w"
    ok() { echo "PASS: $*"; }
    no() {
        echo "FAIL: $*"
        fails=$((fails + 1))
    }

    t=$(now_ms)
    job=$(sbatch --parsable --nodes=2 --ntasks=2 --gres=gpu:1 -o "$w/two.out" \
        --wrap 'srun bash -c "echo host=\$(hostname) localid=\$SLURM_LOCALID procid=\$SLURM_PROCID cvd=\$CUDA_VISIBLE_DEVICES"')
    for ((n = 0; n < 100; n++)); do
        [ "$(grep -c host= "$w/two.out" 2>/dev/null)" = 2 ] && break
        sleep 0.1
    done
    echo "job $job (first output after $(($(now_ms) - t)) ms):"
    sed 's/^/  /' "$w/two.out" 2>/dev/null || true
    hosts=$(grep -o 'host=[^ ]*' "$w/two.out" 2>/dev/null | sort -u | wc -l)
    if [ "$hosts" -eq 2 ]; then ok "2-node job ran on 2 distinct hostnames"; else no "2-node job: $hosts hostnames"; fi

    # more GPUs than any node has: refused at submit ("Requested node configuration
    # is not available"); a held job released later stays PENDING (BadConstraints)
    out=$(sbatch --parsable --gres=gpu:$((GPUS + 5)) -o /dev/null --wrap true 2>&1) || true
    echo "gpu:$((GPUS + 5)) at submit: $out"
    if [[ "$out" =~ ^[0-9]+$ ]]; then no "impossible GPU request accepted"; else ok "impossible GPU request refused"; fi
    job=$(sbatch --parsable --hold --gres=gpu:$((GPUS + 5)) -o /dev/null --wrap true)
    scontrol release "$job"
    sleep 1.5
    reason=$(squeue -h -j "$job" -o '%T %r' 2>/dev/null || true)
    echo "gpu:$((GPUS + 5)) held+released job $job: $reason"
    if [ "$reason" = "PENDING BadConstraints" ]; then ok "impossible GPU job stays PENDING"; else no "gpu job: $reason"; fi
    scancel "$job" 2>/dev/null || true

    # a task that leaves a plain child, a setsid child and a double-forked daemon
    job=$(sbatch --parsable -N2 --ntasks-per-node=1 -o "$w/cancel.out" --wrap \
        'srun bash -c "sleep 7771 & setsid sleep 7772 & setsid bash -c \"nohup sleep 7773 >/dev/null 2>&1 &\"; echo ready; wait"')
    for ((n = 0; n < 100; n++)); do
        [ "$(grep -c ready "$w/cancel.out" 2>/dev/null)" = 2 ] && break
        sleep 0.1
    done
    before=$(ps -eo args | grep -cE '^sleep 777[123]$' || true)
    t=$(now_ms)
    scancel "$job"
    for ((n = 0; n < 300; n++)); do
        [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break
        sleep 0.1
    done
    sleep 1
    after=$(ps -eo args | grep -cE '^sleep 777[123]$' || true)
    echo "scancel ($(cat "$LAB/run/proctrack" 2>/dev/null)): $before processes before, $after after, job gone in $(($(now_ms) - t)) ms"
    if [ "$after" -eq 0 ]; then ok "scancel left no process"; else no "scancel left $after processes"; fi
    echo "$fails failed"
    return "$fails"
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
check) cmd_check ;;
env) cat "$LAB/env" 2>/dev/null || echo "export SLURM_CONF=$CONF" ;;
*)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
