#!/usr/bin/env bash
# A one-node Slurm cluster on localhost for the tests (Debian slurm-wlm + munge, as root).
#   .ci/slurm.sh start DIR   install if missing, write DIR/slurm.conf, start munged,
#                            slurmctld, slurmd; wait until the node is idle;
#                            prints `export SLURM_CONF=...`
#   .ci/slurm.sh stop DIR    scancel what is left, stop the daemons by their pid files
set -euo pipefail
cmd=${1:?start or stop}
dir=${2:?state directory}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/slurm.conf"

stop() {
  if [ -f "$conf" ]; then
    SLURM_CONF="$conf" scancel --user="$(id -un)" >/dev/null 2>&1 || true
  fi
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    if [ -f "$pidfile" ]; then
      pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$pidfile"
    fi
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
fi

host=$(hostname -s)
cpus=8   # advertised: lets 4-8 rank MPI jobs run on a 2-core machine (oversubscribed)
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
# Job ids start at a random number: MPICH names its shared-memory segments after the job
# step, and a segment left in /dev/shm by a killed job of an earlier cluster with the same
# id makes MPI_Init fail ("Message truncated"); fresh clusters would otherwise reuse 1, 2, ...
first_job=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000000 ))
cat > "$conf" <<CONF
ClusterName=hpcpipe-test
FirstJobId=$first_job
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
SchedulerParameters=batch_sched_delay=0
MinJobAge=5
KillWait=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

# munge: key, runtime dir, daemon as the munge user
if [ ! -s /etc/munge/munge.key ]; then
  (command -v mungekey >/dev/null && mungekey --create --force) || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge
if ! munge -n >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  cp /run/munge/munged.pid "$dir/munged.pid" 2>/dev/null || pgrep -u munge -o munged > "$dir/munged.pid"
fi

export SLURM_CONF="$conf"
slurmctld -f "$conf"
slurmd -f "$conf"
for _ in $(seq 300); do
  state=$(sinfo -h -o %T 2>/dev/null || true)
  case "$state" in idle*) break;; esac
  sleep 0.2
done
case "$state" in
  idle*) ;;
  *) echo "slurm did not come up (node state: '$state'); logs in $dir/log" >&2
     tail -20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
     exit 1;;
esac
echo "export SLURM_CONF=$conf"
