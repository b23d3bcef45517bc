#!/usr/bin/env bash
# A small multi-node cluster on one Linux machine, built from network namespaces (as root).
#
#   .ci/cluster.sh up N [--rate RATE] [--slurm]
#                          build an N-node cluster from scratch (tears down first: idempotent);
#                          --rate limits every node's outgoing link (tc tbf) to RATE:
#                          200 (Mbit/s), 200mbit, 128kbit;
#                          --slurm also starts one slurmctld (on ctl) and one slurmd per node
#   .ci/cluster.sh down    stop every process in the namespaces, delete them and their hosts
#                          files, by name; safe after a failed or partial `up`, and when down
#   .ci/cluster.sh status  namespaces, addresses, processes, link byte counters, rate limits
#   .ci/cluster.sh exec NODE CMD...   run CMD on NODE (ctl, n1..nN) with the cluster's env
#   .ci/cluster.sh rate RATE|off      set or remove the bandwidth limit on every node's link
#   .ci/cluster.sh bytes NODE         bytes sent and received on NODE's link (two numbers)
#   .ci/cluster.sh mpiexec HOSTS PPN CMD...
#                          run CMD under the MPI wheel's mpiexec from ctl, PPN ranks on each
#                          of HOSTS (e.g. n1,n2), every rank talking TCP between nodes
#   .ci/cluster.sh kill-node NODE | link-down NODE | link-up NODE | start-node NODE   faults
#   .ci/cluster.sh lose-node NODE     the node vanishes as in a power loss: its link is cut
#                          first (no FIN or RST reaches its peers), then every process on it
#                          is killed; `link-up` and `start-node` bring it back
#
# Topology (nothing is created in the host's default network namespace):
#   netns hpn-sw    a bridge hpn-br0 (the switch), the host ends hpn-v<i> of each node's veth
#   netns hpn-ctl   hostname "ctl", $NET.1: launcher / login node (slurmctld with --slurm)
#   netns hpn-<i>   hostname "n<i>", $NET.(10+i), link hpn-eth0; slurmd with --slurm
# /etc/netns/hpn-*/hosts name every node (`ip netns exec` binds it over /etc/hosts). All
# traffic goes between these addresses only. Every name made here starts with "hpn-".
#
# Environment: HPN_STATE (state dir, default /tmp/hpn-cluster), HPN_NET (default 10.200.0),
#   HPN_CPUS (CPUs per node for Slurm, default 8), HPN_SLURMD_TIMEOUT (default 10),
#   HPN_MPIEXEC (mpiexec to use, default the one on PATH).
set -euo pipefail

P=hpn-
NET=${HPN_NET:-10.200.0}
STATE=${HPN_STATE:-/tmp/hpn-cluster}
CONF=$STATE/slurm/slurm.conf
MUNGE=$STATE/munge
SELF=$(readlink -f "$0")

log() { echo "[cluster] $*" >&2; }
die() { echo "cluster.sh: $*" >&2; exit 2; }

case $NET in
  [0-9]*.[0-9]*.[0-9]*) [[ $NET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] \
    || die "HPN_NET must be three octets such as 10.200.0, not '$NET'";;
  *) die "HPN_NET must be three octets such as 10.200.0, not '$NET'";;
esac
[[ $STATE = /* && $STATE != / ]] || die "HPN_STATE must be an absolute directory, not '$STATE'"

ns_of() { # node name or address -> network namespace
  case $1 in
    ctl | "$NET.1") echo "${P}ctl" ;;
    n[0-9] | n[0-9][0-9]) echo "${P}${1#n}" ;;
    *) return 1 ;;
  esac
}
my_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${P}(sw|ctl|[0-9]+)$" || true; }
nodes() { my_namespaces | grep -E "^${P}[0-9]+$" | sed "s/^${P}/n/" | sort -V; }

# Run a command on a node: its netns (and /etc/hosts), its own UTS namespace with its hostname.
# `ip netns exec` mounts a fresh /sys, which hides /sys/fs/cgroup; slurmd refuses to start
# without it, so the cgroup file systems are mounted again in the node's private mount namespace.
nsrun() {
  local node=$1 ns
  shift
  ns=$(ns_of "$node") || { echo "cluster.sh: unknown node '$node' (ctl, n1, n2, ...)" >&2; return 2; }
  [ -e "/var/run/netns/$ns" ] || { echo "cluster.sh: node $node is not up" >&2; return 2; }
  # shellcheck disable=SC1091
  [ -f "$STATE/env.sh" ] && . "$STATE/env.sh"
  ip netns exec "$ns" unshare --uts /bin/sh -c '
    hostname "$1"
    if ! mountpoint -q /sys/fs/cgroup; then
      while read -r src mp type opts _; do
        case "$type:$mp" in
          tmpfs:/sys/fs/cgroup|cgroup2:/sys/fs/cgroup*|cgroup:/sys/fs/cgroup*)
            mkdir -p "$mp" 2>/dev/null; mount -t "$type" -o "$opts" "$src" "$mp" 2>/dev/null || true;;
        esac
      done < "/proc/$2/mounts"
    fi
    shift 2; exec "$@"' sh "$node" $$ "$@"
}

add_node_ns() { # ns address index
  ip netns add "$1"
  ip -n "${P}sw" link add "${P}v$3" type veth peer name "${P}eth0" netns "$1"
  ip -n "${P}sw" link set "${P}v$3" master "${P}br0" up
  ip -n "$1" link set lo up
  ip -n "$1" addr add "$2/24" dev "${P}eth0"
  ip -n "$1" link set "${P}eth0" up
}

make_net() {
  local n=$1 i ns
  ip netns add "${P}sw"
  ip -n "${P}sw" link set lo up
  ip -n "${P}sw" link add "${P}br0" type bridge
  ip -n "${P}sw" link set "${P}br0" up
  add_node_ns "${P}ctl" "$NET.1" ctl
  for i in $(seq 1 "$n"); do add_node_ns "${P}$i" "$NET.$((10 + i))" "$i"; done
  mkdir -p /etc/netns
  # `ip netns exec` binds /etc/netns/<ns>/hosts over an existing /etc/hosts only
  [ -e /etc/hosts ] || printf '127.0.0.1 localhost\n' >/etc/hosts
  for ns in "${P}ctl" $(seq -f "${P}%g" 1 "$n"); do
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      echo "$NET.1 ctl"
      for i in $(seq 1 "$n"); do echo "$NET.$((10 + i)) n$i"; done
    } >"/etc/netns/$ns/hosts"
  done
}

write_env() {
  mkdir -p "$STATE/bin"
  cat >"$STATE/env.sh" <<EOF
export HPN_STATE=$STATE HPN_NET=$NET
export SLURM_CONF=$CONF
# MPI between the namespaces must use TCP: they share one kernel, so the wheel's default
# transport would otherwise move the bytes through shared memory, not over the links.
export MPICH_CH4_NETMOD=\${MPICH_CH4_NETMOD:-ofi}
export FI_PROVIDER=\${FI_PROVIDER:-tcp}
export UCX_TLS=\${UCX_TLS:-tcp,self}
export FI_TCP_IFACE=\${FI_TCP_IFACE:-${P}eth0}
export UCX_NET_DEVICES=\${UCX_NET_DEVICES:-${P}eth0}
EOF
  # An ssh stand-in for MPICH's hydra: mpiexec -launcher ssh -launcher-exec $STATE/bin/nsssh
  cat >"$STATE/bin/nsssh" <<EOF
#!/bin/bash
while [[ \$# -gt 0 && \$1 == -* ]]; do case \$1 in -o|-p|-l|-i) shift 2;; *) shift;; esac; done
host=\$1; shift
exec "$SELF" exec "\$host" /bin/sh -c "\$*"
EOF
  chmod +x "$STATE/bin/nsssh"
}

RATE_RE='^[1-9][0-9]*(kbit|mbit|gbit)?$'
set_rate() { # RATE|off on every node's outgoing link; RATE: 200 (Mbit/s), 200mbit, 128kbit
  local rate=$1 ns bits burst
  case $rate in
    off) ;;
    *kbit) bits=$((${rate%kbit} * 1000)) ;;
    *gbit) bits=$((${rate%gbit} * 1000000000)) ;;
    *) rate=${rate%mbit}mbit; bits=$((${rate%mbit} * 1000000)) ;;
  esac
  # bucket: one 1/HZ tick of traffic (HZ >= 250), at least one full frame: a message longer
  # than the bucket moves at the rate; the queue holds up to 4 s of traffic
  [ "$rate" = off ] || { burst=$((bits / 8 / 250)); [ "$burst" -lt 1600 ] && burst=1600; }
  for ns in $(my_namespaces | grep -E "^${P}[0-9]+$"); do
    if [ "$rate" = off ]; then
      tc -n "$ns" qdisc del dev "${P}eth0" root 2>/dev/null || true
    else
      tc -n "$ns" qdisc replace dev "${P}eth0" root tbf rate "$rate" burst "$burst" latency 4s
    fi
  done
}

# ---- Slurm (optional): one slurmctld on ctl, one slurmd per node, a private munged ----
start_munge() {
  mkdir -p "$MUNGE"
  chmod 755 "$MUNGE" # munged wants o+x on its socket's directory
  if [ ! -f "$MUNGE/munge.key" ]; then
    dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 2>/dev/null
    chmod 400 "$MUNGE/munge.key"
  fi
  munged --socket="$MUNGE/munge.socket" --key-file="$MUNGE/munge.key" --force \
    --log-file="$MUNGE/munged.log" --pid-file="$MUNGE/munged.pid" --seed-file="$MUNGE/munged.seed"
  munge -S "$MUNGE/munge.socket" -n </dev/null | unmunge -S "$MUNGE/munge.socket" >/dev/null
}

write_slurm_conf() {
  local n=$1 cpus=${HPN_CPUS:-8} i
  mkdir -p "$STATE/slurm" "$STATE/ctld" "$STATE/log" "$STATE/spool"
  # random first job id: see .ci/slurm.sh (MPICH's segments left in /dev/shm by killed jobs)
  cat >"$CONF" <<EOF
ClusterName=hpncluster
FirstJobId=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000000 ))
SlurmctldHost=ctl($NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
SlurmdTimeout=${HPN_SLURMD_TIMEOUT:-10}
SlurmctldTimeout=10
MessageTimeout=5
ReturnToService=2
SchedulerParameters=batch_sched_delay=0
# advertise HPN_CPUS per node whatever the machine has (oversubscribed MPI jobs)
SlurmdParameters=config_overrides
MinJobAge=60
KillWait=5
InactiveLimit=0
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
TmpFS=$STATE/tmp/%n
EOF
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$STATE/slurm/cgroup.conf"
  for i in $(seq 1 "$n"); do
    echo "NodeName=n$i NodeAddr=$NET.$((10 + i)) NodeHostname=n$i CPUs=$cpus RealMemory=1000 State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$CONF"
}

start_slurmd() {
  mkdir -p "$STATE/spool/$1" "$STATE/tmp/$1"
  nsrun "$1" slurmd -f "$CONF" -N "$1"
}

wait_idle() {
  local n=$1 t=0 idle
  while :; do
    idle=$(nsrun ctl sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2=="idle"' | wc -l || true)
    [ "$idle" -ge "$n" ] && return 0
    t=$((t + 1))
    if [ $t -gt 60 ]; then
      log "Slurm nodes not idle after 60 s; logs in $STATE/log"
      nsrun ctl sinfo -N -l >&2 || true
      return 1
    fi
    sleep 1
  done
}

# ---- commands ----
cmd_down() {
  local ns pids sig
  for sig in TERM KILL; do
    for ns in $(my_namespaces); do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      # shellcheck disable=SC2086
      [ -n "$pids" ] && kill -"$sig" $pids 2>/dev/null || true
    done
    [ $sig = TERM ] && [ -n "$(my_namespaces)" ] && sleep 1
  done
  if [ -f "$MUNGE/munged.pid" ]; then
    kill "$(cat "$MUNGE/munged.pid")" 2>/dev/null || true
    rm -f "$MUNGE/munged.pid"
  fi
  for ns in $(my_namespaces); do ip netns del "$ns"; done
  rm -rf /etc/netns/"${P}"*
  [ -d /etc/netns ] && rmdir /etc/netns 2>/dev/null || true # only when nothing else is in it
  rm -rf "$STATE"
  log "down"
}

cmd_up() {
  local n=2 rate="" slurm=0 t0=$SECONDS i
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:-}; shift 2 || die "--rate needs a value, e.g. --rate 200 (Mbit/s)";;
      --slurm) slurm=1; shift;;
      [0-9]*) n=$1; shift;;
      *) die "unknown option '$1' (up N [--rate RATE] [--slurm])";;
    esac
  done
  [[ $n =~ ^[1-9][0-9]?$ ]] || die "N must be a node count from 1 to 99, not '$n'"
  [ -z "$rate" ] || [[ $rate =~ $RATE_RE ]] || die "--rate must be like 200 (Mbit/s), 200mbit or 128kbit, not '$rate'"
  [ "$(id -u)" = 0 ] || die "must be root (network namespaces)"
  command -v ip >/dev/null || die "'ip' not found: install iproute2"
  command -v unshare >/dev/null || die "'unshare' not found: install util-linux"
  if [ $slurm = 1 ]; then
    for c in slurmctld slurmd sinfo munged; do
      command -v $c >/dev/null || die "'$c' not found: apt-get install slurmctld slurmd slurm-client munge"
    done
  fi
  cmd_down 2>/dev/null
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  make_net "$n"
  write_env
  [ -n "$rate" ] && set_rate "$rate"
  if [ $slurm = 1 ]; then
    start_munge
    write_slurm_conf "$n"
    nsrun ctl slurmctld -f "$CONF"
    for i in $(seq 1 "$n"); do start_slurmd "n$i"; done
    wait_idle "$n"
  fi
  log "up: $n nodes${rate:+, links limited to $rate (tbf)}$([ $slurm = 1 ] && echo ', Slurm') in $((SECONDS - t0)) s"
}

cmd_status() {
  local ns node
  if [ -z "$(my_namespaces)" ]; then echo "cluster is down"; return 0; fi
  echo "namespaces: $(my_namespaces | tr '\n' ' ')"
  for node in ctl $(nodes); do
    ns=$(ns_of "$node")
    printf '%-4s %-8s %s  tx/rx bytes: %s  qdisc: %s  pids: %s\n' "$node" "$ns" \
      "$(ip -n "$ns" -br -4 addr show dev "${P}eth0" | awk '{print $3}')" \
      "$(cmd_bytes "$node" | tr '\n' ' ')" \
      "$(tc -n "$ns" qdisc show dev "${P}eth0" | head -1 | awk '{print $2, $7, $8}')" \
      "$(ip netns pids "$ns" | xargs -r ps -o comm= -p | sort | uniq -c | awk '{printf "%s(%s) ", $2, $1}')"
  done
  if [ -f "$CONF" ]; then nsrun ctl sinfo -N -o '%N %T %E' || true; fi
}

cmd_bytes() {
  local ns
  ns=$(ns_of "$1") || die "unknown node '$1'"
  ip netns exec "$ns" cat "/sys/class/net/${P}eth0/statistics/tx_bytes" \
    "/sys/class/net/${P}eth0/statistics/rx_bytes"
}

cmd_mpiexec() {
  local hosts=$1 ppn=$2 exe h
  shift 2
  [[ $hosts =~ ^n[0-9]+(,n[0-9]+)*$ ]] || die "HOSTS must be like n1,n2, not '$hosts'"
  [[ $ppn =~ ^[1-9][0-9]*$ ]] || die "PPN must be a positive integer, not '$ppn'"
  for h in ${hosts//,/ }; do [ -e "/var/run/netns/$(ns_of "$h")" ] || die "node $h is not up"; done
  exe=${HPN_MPIEXEC:-$(command -v mpiexec)} || die "mpiexec not found (set HPN_MPIEXEC)"
  nsrun ctl "$exe" -launcher ssh -launcher-exec "$STATE/bin/nsssh" -hosts "$hosts" -ppn "$ppn" \
    -n "$(($(echo "${hosts//,/ }" | wc -w) * ppn))" "$@"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  exec) [ $# -ge 3 ] || die "exec NODE CMD..."; shift; node=$1; shift; nsrun "$node" "$@" ;;
  rate) [ $# -eq 2 ] || die "rate RATE|off"
    [[ $2 = off || $2 =~ $RATE_RE ]] || die "rate must be like 200 (Mbit/s), 200mbit, 128kbit or off, not '$2'"
    set_rate "$2" ;;
  bytes) [ $# -eq 2 ] || die "bytes NODE"; cmd_bytes "$2" ;;
  mpiexec) [ $# -ge 4 ] || die "mpiexec HOSTS PPN CMD..."; shift; cmd_mpiexec "$@" ;;
  kill-node) ns=$(ns_of "${2:-}") || die "kill-node NODE"
    pids=$(ip netns pids "$ns")
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -KILL $pids
    log "killed $(echo $pids | wc -w) processes on $2" ;;
  lose-node) ns=$(ns_of "${2:-}") || die "lose-node NODE"
    ip -n "${P}sw" link set "${P}v${ns#"$P"}" down
    pids=$(ip netns pids "$ns")
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -KILL $pids
    log "lost $2: link cut, killed $(echo $pids | wc -w) processes" ;;
  link-down) ns=$(ns_of "${2:-}") || die "link-down NODE"; ip -n "${P}sw" link set "${P}v${ns#"$P"}" down ;;
  link-up) ns=$(ns_of "${2:-}") || die "link-up NODE"; ip -n "${P}sw" link set "${P}v${ns#"$P"}" up ;;
  start-node) [ $# -eq 2 ] || die "start-node NODE"; start_slurmd "$2" ;;
  *) sed -n '2,24p' "$SELF"; exit 2 ;;
esac
