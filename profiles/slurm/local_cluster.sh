#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine (munge, slurmctld, slurmd), to try and test
# profiles/slurm without a cluster. Needs root; installs Debian's slurm-wlm and munge when missing.
#
#   profiles/slurm/local_cluster.sh start [DIR]   # start it; state, spool and logs under DIR
#   profiles/slurm/local_cluster.sh status [DIR]  # sinfo of the running cluster
#   profiles/slurm/local_cluster.sh stop [DIR]    # stop the daemons, remove nothing but pid files
#   eval "$(profiles/slurm/local_cluster.sh env [DIR])"   # SLURM_CONF for sbatch/squeue/snakemake
#
# DIR defaults to .slurm in the project (ignored by git). The daemons run as root and this script
# writes and reads DIR as root (slurm.conf, logs, pid files it kills by), so DIR must be private: a
# real directory, not a symbolic link, owned by the caller, writable by no one else and holding no
# symbolic links; the script creates it 0700 and refuses any other. (A fixed /tmp path let any local
# user plant a link there and have root overwrite or kill what it points to.)
# One partition, "debug", holds the node (this machine's hostname, all its CPUs, 90 % of its memory). There is no accounting database, so `sacct` does not
# work: run Snakemake with --slurm-status-command squeue --slurm-no-account (see profiles/slurm).
# The configuration is also linked to /etc/slurm/slurm.conf, where job steps look for it (the
# Snakemake job-step executor clears SLURM_* variables before its nested srun); an existing
# /etc/slurm/slurm.conf that this script did not write is never replaced.
set -euo pipefail

command=${1:-}
project=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)
dir=${2:-$project/.slurm}
conf="$dir/slurm.conf"

MARKER="# Written by profiles/slurm/local_cluster.sh: one node, no accounting."
SYSTEM_CONF=/etc/slurm/slurm.conf

die() { echo "local_cluster.sh: $*" >&2; exit 1; }

# Refuse a DIR another user could have prepared or can still change; with create, make it (0700).
check_private_dir() {
    local create=${1:-} owner mode
    [ -L "$dir" ] && die "$dir is a symbolic link; refusing to follow it (give a real directory)"
    if [ ! -e "$dir" ]; then
        [ "$create" = create ] || return 0
        mkdir -p -- "$(dirname -- "$dir")"
        mkdir -m 0700 -- "$dir"
    fi
    [ -d "$dir" ] || die "$dir is not a directory"
    owner=$(stat -c %u -- "$dir")
    mode=$(stat -c %a -- "$dir")
    [ "$owner" = "$(id -u)" ] || die "$dir belongs to uid $owner, not to you (uid $(id -u)); refusing to use it"
    (( (8#$mode & 8#022) == 0 )) || die "$dir is writable by others (mode $mode); refusing to use it"
    if [ -n "$(find "$dir" -mindepth 1 -maxdepth 3 -type l -print -quit)" ]; then
        die "$dir holds symbolic links ($(find "$dir" -mindepth 1 -maxdepth 3 -type l | head -n 3 | tr '\n' ' ')); refusing to follow them"
    fi
    chmod 0700 -- "$dir"
    dir=$(cd -- "$dir" && pwd -P)
    conf="$dir/slurm.conf"
}

link_system_config() {
    if [ -e "$SYSTEM_CONF" ] && ! head -n 1 "$SYSTEM_CONF" | grep -qxF "$MARKER"; then
        die "$SYSTEM_CONF exists and was not written by this script; not replacing it"
    fi
    mkdir -p "$(dirname "$SYSTEM_CONF")"
    ln -sfn "$conf" "$SYSTEM_CONF"
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are missing and installing them needs root"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get"
    echo "installing slurm-wlm and munge (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$dir/apt.log" 2>&1 \
        || die "apt-get install slurm-wlm munge failed; see $dir/apt.log"
}

write_config() {
    local host cpus memory
    host=$(hostname)
    cpus=$(nproc)
    memory=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    cat >"$conf" <<EOF
$MARKER
ClusterName=trainmap
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    if pgrep -x munged >/dev/null; then
        return
    fi
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    if id munge >/dev/null 2>&1; then
        chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
        chmod 0700 /etc/munge
        chmod 0400 /etc/munge/munge.key
        runuser -u munge -- /usr/sbin/munged
    else
        /usr/sbin/munged --force
    fi
}

wait_for_node() {
    for _ in $(seq 1 60); do
        if SLURM_CONF=$conf sinfo -h -o "%t" 2>/dev/null | grep -qE "^(idle|mix|alloc)"; then
            return
        fi
        sleep 1
    done
    die "the node did not become idle within 60 s; see $dir/log/"
}

case "$command" in
    start)
        [ "$(id -u)" = 0 ] || die "starting SLURM daemons needs root"
        check_private_dir create
        install_packages
        write_config
        link_system_config
        start_munge
        if ! { [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; }; then
            SLURM_CONF=$conf /usr/sbin/slurmctld -f "$conf"
        fi
        if ! { [ -f "$dir/slurmd.pid" ] && kill -0 "$(cat "$dir/slurmd.pid")" 2>/dev/null; }; then
            SLURM_CONF=$conf /usr/sbin/slurmd -f "$conf"
        fi
        wait_for_node
        SLURM_CONF=$conf sinfo
        echo "SLURM is up; use: export SLURM_CONF=$conf"
        ;;
    stop)
        check_private_dir
        for daemon in slurmd slurmctld; do
            if [ -f "$dir/$daemon.pid" ]; then
                kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
                rm -f "$dir/$daemon.pid"
            fi
        done
        pkill -x slurmstepd 2>/dev/null || true
        if [ -L "$SYSTEM_CONF" ] && [ "$(readlink "$SYSTEM_CONF")" = "$conf" ]; then
            rm -f "$SYSTEM_CONF"
        fi
        echo "SLURM daemons stopped (munged left running)"
        ;;
    status)
        check_private_dir
        [ -f "$conf" ] || die "no cluster configured in $dir"
        SLURM_CONF=$conf sinfo
        SLURM_CONF=$conf squeue
        ;;
    env)
        check_private_dir
        echo "export SLURM_CONF=$conf"
        ;;
    *)
        die "usage: $0 start|stop|status|env [DIR]"
        ;;
esac
