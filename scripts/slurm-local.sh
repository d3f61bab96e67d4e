#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying the slurm profile and for
# tests/test_slurm.py: munged, slurmctld and slurmd, no accounting database (job status comes
# from squeue, see profiles/slurm/config.yaml).
#
#   scripts/slurm-local.sh start [--install]   # start it; waits until the node is idle
#   scripts/slurm-local.sh status              # sinfo and squeue of the running cluster
#   scripts/slurm-local.sh running             # exit 0 (printing its state dir) if one is up
#   scripts/slurm-local.sh stop                # stop the daemons it started, remove its state
#
# --install: as root, apt-get install the Debian packages (slurmctld slurmd slurm-client munge)
# when a binary is missing. Everything the cluster writes lives in $SLURM_LOCAL_DIR (default
# /tmp/dlmpipe-slurm) except /etc/slurm/slurm.conf, where srun inside a job looks for it; that file
# is written only when absent (or written earlier by this script) and removed by `stop`.
# Exit status: 0 ok, 2 usage, 3 SLURM cannot start here (the reason on stderr, one line starting
# with "slurm-local: cannot start:").
set -euo pipefail

STATE=${SLURM_LOCAL_DIR:-/tmp/dlmpipe-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by dlmpipe scripts/slurm-local.sh"
NODE=$(hostname -s 2>/dev/null || cut -d. -f1 /proc/sys/kernel/hostname)
PATH=$PATH:/usr/sbin:/sbin

cannot() { echo "slurm-local: cannot start: $*" >&2; exit 3; }
log() { echo "slurm-local: $*" >&2; }

missing_binaries() {
  local b out=""
  for b in munged slurmctld slurmd slurmstepd sinfo sbatch squeue srun scontrol; do
    command -v "$b" >/dev/null 2>&1 || out="$out $b"
  done
  echo "${out# }"
}

install_packages() {
  [ "$(id -u)" = 0 ] || cannot "missing $(missing_binaries) and not root (apt-get install slurmctld slurmd slurm-client munge)"
  command -v apt-get >/dev/null 2>&1 || cannot "missing $(missing_binaries) and no apt-get"
  log "installing slurmctld slurmd slurm-client munge with apt-get"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
     slurmctld slurmd slurm-client munge >"$STATE.apt.log" 2>&1) \
    || cannot "apt-get install failed (log: $STATE.apt.log)"
}

ours_conf() { [ -f "$CONF" ] && head -1 "$CONF" | grep -qF "$MARK"; }
# the state directory named by our slurm.conf (the cluster that wrote it)
conf_state() { sed -n 's/^StateSaveLocation=\(.*\)\/ctld$/\1/p' "$CONF"; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local cpus mem_mb
  # the CPUs this machine gives us (GNU nproc also obeys OMP_NUM_THREADS, a thread limit of the
  # calling process, not the node's size: a node that small cannot run a group of two jobs)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  # leave the OS some memory; SLURM refuses jobs asking for more than RealMemory
  mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  mkdir -p "$(dirname "$CONF")"
  cat > "$CONF" <<EOF
$MARK (state in $STATE); removed by its 'stop'
ClusterName=dlmpipe-local
SlurmctldHost=$NODE(127.0.0.1)
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$STATE/munge.socket
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${SLURM_LOCAL_PORT:-16817}
SlurmdPort=$(( ${SLURM_LOCAL_PORT:-16817} + 1 ))
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
# no cgroups, no accounting: works in containers and small VMs
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# squeue reports finished jobs for MinJobAge seconds: long enough for the slurm executor's
# status checks (it wants >= 3x its first-check delay)
MinJobAge=600
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  local install=0
  [ "${1:-}" = "--install" ] && install=1
  mkdir -p "$(dirname "$STATE")"
  if [ -n "$(missing_binaries)" ]; then
    [ $install = 1 ] || cannot "missing $(missing_binaries) (run with --install as root, or apt-get install slurmctld slurmd slurm-client munge)"
    install_packages
    [ -z "$(missing_binaries)" ] || cannot "still missing after apt-get: $(missing_binaries)"
  fi
  if [ -f "$CONF" ] && ! ours_conf; then
    cannot "$CONF exists and was not written by this script (a real cluster's configuration is left alone)"
  fi
  if ours_conf && [ "$(conf_state)" != "$STATE" ] && pid_alive "$(conf_state)/slurmctld.pid"; then
    cannot "another slurm-local cluster runs (state in $(conf_state)); use it, or stop it with SLURM_LOCAL_DIR=$(conf_state) $0 stop"
  fi
  [ "$(id -u)" = 0 ] || cannot "slurmd must run as root (it starts jobs as their users)"
  if pid_alive "$STATE/slurmctld.pid" && pid_alive "$STATE/slurmd.pid"; then
    log "already running (state in $STATE)"
  else
    stop >/dev/null 2>&1 || true
    mkdir -p "$STATE/ctld" "$STATE/d"
    chmod 0700 "$STATE"
    # a private munge key and socket: a munged the system may run is not touched
    head -c 1024 /dev/urandom > "$STATE/munge.key"
    chmod 0400 "$STATE/munge.key"
    write_conf
    munged --force --socket="$STATE/munge.socket" --key-file="$STATE/munge.key" \
      --pid-file="$STATE/munged.pid" --log-file="$STATE/munged.log" --seed-file="$STATE/munged.seed" \
      || cannot "munged did not start: $(tail -3 "$STATE/munged.log" 2>/dev/null | tr '\n' ' ')"
    slurmctld -c || cannot "slurmctld did not start: $(tail -3 "$STATE/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
    slurmd || cannot "slurmd did not start: $(tail -3 "$STATE/slurmd.log" 2>/dev/null | tr '\n' ' ')"
  fi
  local state="" i
  for i in $(seq 1 120); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1 || true)
    case "$state" in
      idle|mixed|allocated) log "node $NODE is $state (partition local, state in $STATE)"; return 0 ;;
      down*|drain*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    for d in slurmctld slurmd; do
      pid_alive "$STATE/$d.pid" || cannot "$d exited: $(tail -3 "$STATE/$d.log" 2>/dev/null | tr '\n' ' ')"
    done
    sleep 0.5
  done
  cannot "node $NODE not idle after 60 s (state: ${state:-none}; $(tail -2 "$STATE/slurmd.log" 2>/dev/null | tr '\n' ' '))"
}

stop() {
  local d pid i
  if ours_conf && command -v scancel >/dev/null 2>&1; then
    scancel --full --quiet --partition=local 2>/dev/null || true
  fi
  for d in slurmd slurmctld munged; do
    [ -f "$STATE/$d.pid" ] || continue
    pid=$(cat "$STATE/$d.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if ours_conf && [ "$(conf_state)" = "$STATE" ]; then rm -f "$CONF"; fi
  rm -rf "$STATE" "$STATE.apt.log"
  log "stopped"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) sinfo; squeue ;;
  running)
    if ours_conf && pid_alive "$(conf_state)/slurmctld.pid" && pid_alive "$(conf_state)/slurmd.pid"; then
      conf_state
    else
      exit 1
    fi ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
