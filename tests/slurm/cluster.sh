#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine for tests/slurm: a private munged,
# slurmctld, and two slurmd (nodes n1 and n2, both at 127.0.0.1, each with two fake
# GPUs), everything under $NBDDP_SLURMLAB (default /tmp/nbddp-slurm).
#   cluster.sh start   idempotent; waits until both nodes are up
#   cluster.sh stop    cancels every job, ends the daemons and any step left
# Facts it rests on: a step tells its node by SLURMD_NODENAME (both nodes are
# localhost); fake GPUs are /dev/null links with AutoDetect=off; a step's orphans
# are tracked only with proctrack/cgroup (a writable cgroup v1 freezer), else linuxproc.
set -euo pipefail
L=${NBDDP_SLURMLAB:-/tmp/nbddp-slurm}
export SLURM_CONF=$L/etc/slurm.conf

ours() { [ -s "$L/run/$1.pid" ] && p=$(cat "$L/run/$1.pid") && [ -d "/proc/$p" ] \
  && grep -q "$2" "/proc/$p/comm" && echo "$p"; }
steps() { for d in /proc/[0-9]*; do
  [ "$(cat "$d/comm" 2>/dev/null)" = slurmstepd ] || continue
  ls -l "$d/fd" 2>/dev/null | grep -q " $L/" && echo "${d#/proc/}"; done; true; }

start() {
  mkdir -p "$L"/{etc,run,log,state,spool/n1,spool/n2,dev}
  install -d -m 700 "$L/munge"
  [ -s "$L/munge/key" ] || (umask 077 && head -c 1024 /dev/urandom > "$L/munge/key")
  chmod 400 "$L/munge/key"
  for i in 0 1; do ln -sfn /dev/null "$L/dev/nvidia$i"; done
  local track=linuxproc task=none
  if mkdir /sys/fs/cgroup/freezer/nbddp_probe 2>/dev/null; then
    rmdir /sys/fs/cgroup/freezer/nbddp_probe; track=cgroup; task=cgroup
  fi
  cat > "$L/etc/slurm.conf" <<CONF
ClusterName=nbddp
SlurmctldHost=localhost
SlurmctldPort=16917
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$L/run/munge.socket
StateSaveLocation=$L/state
SlurmdSpoolDir=$L/spool/%n
SlurmctldPidFile=$L/run/slurmctld.pid
SlurmdPidFile=$L/run/slurmd-%n.pid
SlurmctldLogFile=$L/log/slurmctld.log
SlurmdLogFile=$L/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/$track
TaskPlugin=task/$task
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
GresTypes=gpu
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17101 CPUs=2 RealMemory=4000 Gres=gpu:2
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17102 CPUs=2 RealMemory=4000 Gres=gpu:2
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  printf 'AutoDetect=off\nNodeName=n[1-2] Name=gpu File=%s/dev/nvidia[0-1]\n' "$L" > "$L/etc/gres.conf"
  printf 'CgroupPlugin=cgroup/v1\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n' \
    > "$L/etc/cgroup.conf"
  ours munged munged >/dev/null || munged -S "$L/run/munge.socket" --key-file="$L/munge/key" \
    --pid-file="$L/run/munged.pid" --log-file="$L/log/munged.log" --seed-file="$L/munge/seed"
  ours slurmctld slurmctld >/dev/null || slurmctld -c
  for n in n1 n2; do ours "slurmd-$n" slurmd >/dev/null || slurmd -N $n; done
  for _ in $(seq 150); do
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -cE '^(idle|mix|alloc)$')" = 2 ] && return 0
    sleep 0.2
  done
  echo "the Slurm test cluster's nodes are not up after 30 s:" >&2; sinfo -N >&2 || true
  return 1
}

stop() {
  if ours slurmctld slurmctld >/dev/null; then
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    [ -n "$jobs" ] && { scancel --signal=KILL --full $jobs || true; scancel $jobs || true; }
    for _ in $(seq 75); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && [ -z "$(steps)" ] && break; sleep 0.2
    done
  fi
  pids=""
  for d in slurmd-n1:slurmd slurmd-n2:slurmd slurmctld:slurmctld munged:munged; do
    p=$(ours "${d%%:*}" "${d##*:}") && { kill -TERM "$p"; pids="$pids $p"; } || true
  done
  for p in $(steps); do kill -KILL "$p"; done
  for _ in $(seq 75); do
    left=""; for p in $pids; do [ -d "/proc/$p" ] && left="$left $p"; done
    [ -z "$left" ] && break; sleep 0.2
  done
  for p in ${left:-}; do kill -KILL "$p" 2>/dev/null || true; done
  rm -f "$L"/run/*.pid
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
