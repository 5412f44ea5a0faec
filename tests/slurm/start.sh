#!/usr/bin/env bash
# Starts (or stops) a throwaway single-node Slurm cluster for the tests.
#
#   tests/slurm/start.sh start STATE_DIR   # installs slurm-wlm + munge if missing, starts the daemons
#   tests/slurm/start.sh stop STATE_DIR    # stops them and removes the network namespace
#
# Everything stays on loopback: slurmctld and slurmd run inside a network
# namespace of their own (STATE_DIR/netns) whose only interface is `lo`, so
# neither they nor the job steps they start (which inherit the namespace) can
# bind or reach any other address. Clients enter it too:
#   nsenter --net=STATE_DIR/netns env SLURM_CONF=STATE_DIR/slurm.conf sbatch ...
# (STATE_DIR/env holds those two settings). munged talks over a Unix socket only.
# Needs root (apt-get, nsenter, SlurmUser=root). Prints "ready" when `sinfo`
# shows the node idle.
set -euo pipefail
action=${1:?usage: start.sh start|stop STATE_DIR}
state=${2:?usage: start.sh start|stop STATE_DIR}
mkdir -p "$state"
state=$(cd "$state" && pwd)
netns=$state/netns
conf=$state/slurm.conf
in_ns() { nsenter --net="$netns" env SLURM_CONF="$conf" "$@"; }

stop() {
  for daemon in slurmd slurmctld; do
    if [ -s "$state/$daemon.pid" ]; then
      pid=$(cat "$state/$daemon.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$state/$daemon.pid"
    fi
  done
  if [ -s "$state/munged.pid" ]; then  # Only a munged this script started.
    kill "$(cat "$state/munged.pid")" 2>/dev/null || true
    rm -f "$state/munged.pid"
  fi
  if [ -e "$netns" ]; then umount "$netns" 2>/dev/null || true; rm -f "$netns"; fi
}

if [ "$action" = stop ]; then stop; exit 0; fi
[ "$action" = start ] || { echo "unknown action: $action (expected start or stop)" >&2; exit 2; }

# 1. Packages (Debian's slurm-wlm is Slurm 22.05 on bookworm; iproute2 for `ip`).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v ip >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge iproute2 >"$state/apt.log" 2>&1 \
    || { tail -20 "$state/apt.log" >&2; exit 1; }
fi

# 2. munge: a key, then munged (unless one already answers).
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
  runuser -u munge -- munged --pid-file=/run/munge/munged.pid
  cp /run/munge/munged.pid "$state/munged.pid"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# 3. A loopback-only network namespace for the daemons and the jobs.
if [ ! -e "$netns" ]; then
  touch "$netns"
  unshare --net="$netns" true
fi
nsenter --net="$netns" ip link set lo up
# The daemons bind with getaddrinfo(NULL, AI_PASSIVE|AI_ADDRCONFIG), which glibc answers only if some
# IPv4 address other than 127.0.0.1 is configured: a second loopback address satisfies it.
nsenter --net="$netns" ip addr add 127.0.0.2/8 dev lo 2>/dev/null || true

# 4. slurm.conf: one node (this host's name, address 127.0.0.1), one partition.
host=$(hostname -s)
cpus=$(nproc)
# A test node offers at least 4 CPUs so that a chief, a ps and 2 workers fit in one job on a
# 2-core machine; config_overrides lets slurmd register with more CPUs than it finds.
[ "$cpus" -ge 4 ] || cpus=4
mkdir -p "$state/ctld" "$state/spool" "$state/log"
cat >"$conf" <<EOF
ClusterName=tfdist-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds (default 120) before it may start again.
AuthInfo=cred_expire=5
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
# Look at pending (e.g. requeued) jobs every 2 s rather than every 60 s.
SchedulerParameters=sched_interval=2
KillWait=10
MinJobAge=300
InactiveLimit=0
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
printf 'SLURM_CONF=%s\nNETNS=%s\n' "$conf" "$netns" >"$state/env"

# 5. The daemons (they fork into the background; -c starts from an empty state).
in_ns slurmctld -c
in_ns slurmd
for _ in $(seq 150); do
  if in_ns timeout 5 sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle; then echo ready; exit 0; fi
  sleep 0.2
done
echo "Slurm did not come up; logs:" >&2
tail -20 "$state/log/slurmctld.log" "$state/log/slurmd.log" >&2 || true
exit 1
