#!/usr/bin/env bash
# CI-only: a real one-node SLURM cluster on this host, so the slurm tests of
# ensio (tests/test_slurm_*.py) run against sbatch/squeue/scancel as users meet
# them. Called by .ci/run before `make test`.
#
# Contract:
#   * a problem prints "setup-slurm: ERROR: <reason>" and the script exits 1;
#     .ci/run then fails CI with that reason when CI=true (the SLURM tests are
#     required there), and elsewhere warns and lets the SLURM tests skip;
#   * idempotent: if SLURM already answers and the node is usable, it only
#     prints the summary; a half-started cluster is completed;
#   * bounded: apt has a timeout, readiness is polled for at most
#     SLURM_SETUP_WAIT seconds (default 60).
#
# Start/stop by hand (no systemd here, the daemons run in the background):
#   start:  bash .ci/setup-slurm.sh      # from the repository root, as root
#   stop:   scontrol shutdown            # slurmctld + slurmd
#           kill "$(cat /run/munge/munged.pid)"
#   logs:   /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log
#   A changed slurm.conf is applied only if SLURM is not usable already:
#   stop it first (above), then rerun this script.
#
# Time: ~20 s from scratch (apt install of 7 packages, then the node is idle
# within a second); ~10 s after a stop (sinfo retries while slurmctld starts);
# instant when SLURM already runs.
#
# Quirks found on Debian 12 (slurm-wlm 22.05.8, munge 0.5.15) in a container/VM
# without systemd:
#   * the packages' postinst tries `invoke-rc.d start`; policy-rc.d (exit 101)
#     or the missing init only print a warning: the daemons are started here
#     directly, never through systemd/init scripts.
#   * --no-install-recommends: slurm-wlm recommends ~27 plugin packages
#     (ipmi, rrd, hdf5, rocm, elasticsearch, ...) that one CI node never uses;
#     without them the install is 7 packages and takes seconds.
#   * munge's postinst already creates /etc/munge/munge.key; we create one only
#     if it is missing. munged checks that its key, log and state files are
#     owned by the user it runs as; the package gives them to `munge`, so it
#     runs as that user (runuser; as root it exits with "Logfile is
#     insecure") and needs /run/munge owned by munge (tmpfs: recreated here).
#   * SlurmUser=root and SlurmdUser=root: the simplest choice here, no
#     ownership dance for the spool and log directories.
#   * No cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
#     JobAcctGatherType=jobacct_gather/none and no cgroup.conf, so neither
#     daemon touches /sys/fs/cgroup (which is a v1/v2 hybrid, often read-only,
#     in containers).
#   * NodeName is `hostname -s` and slurmd is started with `-N` that name, so
#     it finds its node line even if the FQDN differs; NodeAddr/SlurmctldHost
#     address are 127.0.0.1 so nothing depends on DNS.
#   * ReturnToService=2: a node that went DOWN (e.g. slurmd restarted) comes
#     back by itself once slurmd registers with a valid configuration.
#   * RealMemory is 95 % of MemTotal: if it were larger than what slurmd
#     measures, the node would be drained with "Low RealMemory".
#   * MinJobAge=60: finished jobs stay visible to squeue/scontrol for a
#     minute, long enough for ensio to read their final state, short enough to
#     keep squeue tidy (the default is 300 s). KillWait=5: a job over its time
#     limit gets SIGTERM, then SIGKILL 5 s later.
#   * slurmd 22.05 loads every MPI plugin and logs "mpi/pmix: can not load
#     PMIx library" errors at start even with MpiDefault=none: harmless.
#   * a freshly (re)started slurmctld makes sinfo retry for ~10 s; `scontrol
#     ping` answers at once (ensio's availability check uses it first).
#   * SLURM checks time limits and --signal warnings only every ~30 s, so a
#     --signal=B:USR1@lead can arrive up to ~60 s early (seen: 12 s early for
#     a 30 s lead) and a job can overrun its limit by up to ~30 s; ensio's
#     worker keeps its own timer as well.
#   * MPICH's mpiexec (the mpich wheel) inside a batch job detects SLURM and
#     starts its proxy with srun into the job's allocation; that works with
#     this configuration (no extra setup needed).
#   * the daemons double-fork; where PID 1 is not a real init (this VM), the
#     exited intermediate process stays as a harmless <defunct> entry.
#   * root may submit jobs (DisableRootJobs defaults to NO); CI runs as root.
set -uo pipefail

WAIT=${SLURM_SETUP_WAIT:-60}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm
NODE=$(hostname -s 2>/dev/null || uname -n)
NODE=${NODE%%.*}
CLUSTER=ensio-ci
PARTITION=debug

die() {
  echo "setup-slurm: ERROR: $*" >&2
  exit 1
}
info() { echo "setup-slurm: $*"; }

node_state() {
  # Empty if SLURM does not answer; else e.g. "idle", "mixed", "down*".
  timeout 10 sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1
}

summary() {
  local state
  state=$(node_state)
  echo "SLURM ready: $(sinfo --version 2>/dev/null), node $NODE state ${state:-?}," \
    "partition $PARTITION, $(timeout 10 sinfo -h -N -n "$NODE" -o '%c' 2>/dev/null | head -n1) CPUs," \
    "setup ${SECONDS}s (logs in $LOG_DIR)"
}

usable() {
  case "$(node_state)" in
    idle|mixed|allocated|completing) return 0 ;;
    *) return 1 ;;
  esac
}

# --- already running? ---------------------------------------------------------
if command -v sinfo >/dev/null && usable; then
  summary
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  die "not root, cannot install or start SLURM"
fi

# --- packages ------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
  command -v apt-get >/dev/null || die "no apt-get (not Debian?), cannot install slurm-wlm"
  info "installing slurm-wlm and munge (apt)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -qq </dev/null >/dev/null 2>&1 || info "apt-get update failed, trying the cached lists"
  timeout 600 apt-get install -y -qq --no-install-recommends slurm-wlm munge </dev/null >/tmp/setup-slurm-apt.log 2>&1 \
    || { tail -n 20 /tmp/setup-slurm-apt.log >&2; die "apt-get install slurm-wlm munge failed"; }
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    || die "slurmctld/slurmd/munged still missing after apt-get install"
fi

# --- configuration -------------------------------------------------------------
CPUS=$(nproc)
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
REAL_MB=$(( MEM_KB / 1024 * 95 / 100 ))
mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/slurm \
  || die "cannot create SLURM directories"

NEW_CONF=$(cat <<EOF
# Written by ensio .ci/setup-slurm.sh: one-node CI cluster on $NODE.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobContainerType=job_container/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=5
MinJobAge=60
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE DefaultTime=60 State=UP
EOF
)
CONF_CHANGED=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
  printf '%s\n' "$NEW_CONF" >"$CONF" || die "cannot write $CONF"
  CONF_CHANGED=1
fi

# --- munge ---------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
  info "creating /etc/munge/munge.key"
  mkdir -p /etc/munge
  if command -v mungekey >/dev/null; then
    mungekey --create --force >/dev/null 2>&1
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key \
    || die "cannot create the munge key"
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 755 /run/munge
if ! timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; then
  info "starting munged"
  runuser -u munge -- /usr/sbin/munged </dev/null >>"$LOG_DIR/munged.out" 2>&1 \
    || die "munged failed to start (see /var/log/munge/munged.log)"
  for _ in $(seq 1 20); do
    timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1 && break
    sleep 0.5
  done
  timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1 \
    || die "munge does not work (munge -n | unmunge fails)"
fi

# --- slurmctld / slurmd --------------------------------------------------------
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if running /run/slurm/slurmctld.pid && [ "$CONF_CHANGED" = 1 ]; then
  info "configuration changed: restarting the SLURM daemons"
  timeout 20 scontrol shutdown >/dev/null 2>&1
  for _ in $(seq 1 40); do
    running /run/slurm/slurmctld.pid || running /run/slurm/slurmd.pid || break
    sleep 0.5
  done
fi
if ! running /run/slurm/slurmctld.pid; then
  info "starting slurmctld"
  slurmctld </dev/null >>"$LOG_DIR/slurmctld.out" 2>&1 \
    || { tail -n 20 "$LOG_DIR/slurmctld.log" >&2 2>/dev/null; die "slurmctld failed to start"; }
fi
if ! running /run/slurm/slurmd.pid; then
  info "starting slurmd"
  slurmd -N "$NODE" </dev/null >>"$LOG_DIR/slurmd.out" 2>&1 \
    || { tail -n 20 "$LOG_DIR/slurmd.log" >&2 2>/dev/null; die "slurmd failed to start"; }
fi

# --- wait until the node is idle (bounded) -------------------------------------
deadline=$(( SECONDS + WAIT ))
resumed=0
while (( SECONDS < deadline )); do
  state=$(node_state)
  case "$state" in
    idle|mixed|allocated|completing) summary; exit 0 ;;
    drain*|down*)
      # e.g. left DOWN by an earlier run: resume it once slurmd has registered.
      if [ "$resumed" = 0 ] && running /run/slurm/slurmd.pid; then
        timeout 10 scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 && resumed=1
      fi ;;
  esac
  sleep 1
done
{
  echo "--- sinfo:"; timeout 10 sinfo -N -l 2>&1
  echo "--- slurmctld.log:"; tail -n 15 "$LOG_DIR/slurmctld.log" 2>&1
  echo "--- slurmd.log:"; tail -n 15 "$LOG_DIR/slurmd.log" 2>&1
} >&2
die "node $NODE not idle after ${WAIT}s (state: '$(node_state)')"
