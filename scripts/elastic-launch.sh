#!/usr/bin/env bash
# Relaunches an MPI training job on the hosts that still answer, resuming
# from its checkpoints, in the manner of torchrun's --max-restarts.
#
#   scripts/elastic-launch.sh [--hosts h1,h2,...] [--ranks-per-host N]
#       [--max-restarts N] [--mpirun-arg ARG]... -- COMMAND [ARGS...]
#
# COMMAND runs under `mpirun --bind-to none` with N ranks on each host (one
# rank per host by default; ranks on one host take disjoint devices). When
# the job fails (a rank or a host died: MPI ends every rank, and the
# trainer's checkpoints hold each step), the hosts are checked again
# (`mpirun -np 1 --host H true`, 30 s at most each), the ones that do not
# answer are dropped, and COMMAND runs again on the survivors with
# `--resume` appended: the ranks agree on the newest checkpoint every one of
# them holds, and each rank's share of the batch is derived again for the
# new number of ranks (under a fixed global batch the run goes on with the
# same batches). Exit codes: 0 when COMMAND succeeds; 75 when COMMAND was
# stopped by SIGTERM (a scheduler's preemption: every rank checkpointed; let
# the scheduler requeue it); otherwise COMMAND's last code once the restarts
# are used up or no host is left.
#
# A job does not go on by itself with fewer ranks ("survivors continue"):
# that needs an MPI that can shrink a communicator after a failure (ULFM's
# MPIX_Comm_shrink), which rsmpi, the MPI crate used here, does not expose.
# So a failure costs a restart from the last checkpoint.
#
# Example (two machines, 4 GPUs each, one rank per machine):
#   scripts/elastic-launch.sh --hosts node1,node2 --max-restarts 3 -- \
#     target/release/train --devices 4 --output-dir runs/a
set -euo pipefail

hosts="localhost"
per_host=1
max_restarts=3
mpirun_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) per_host="$2"; shift 2 ;;
    --max-restarts) max_restarts="$2"; shift 2 ;;
    --mpirun-arg) mpirun_args+=("$2"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "elastic-launch: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "elastic-launch: no command after -- (see --help)" >&2; exit 2; }
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || { echo "elastic-launch: --ranks-per-host must be a whole number >= 1, got $per_host" >&2; exit 2; }
[[ "$max_restarts" =~ ^[0-9]+$ ]] || { echo "elastic-launch: --max-restarts must be a whole number >= 0, got $max_restarts" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "elastic-launch: mpirun is not on PATH (apt-get install -y openmpi-bin)" >&2; exit 2; }

IFS=',' read -r -a alive <<<"$hosts"
[ "${#alive[@]}" -gt 0 ] || { echo "elastic-launch: --hosts is empty" >&2; exit 2; }
resume=()
restarts=0
while true; do
  host_list=""
  for h in "${alive[@]}"; do host_list+="$h:$per_host,"; done
  host_list="${host_list%,}"
  ranks=$(( ${#alive[@]} * per_host ))
  echo "elastic-launch: $ranks ranks on ${alive[*]} (restart $restarts of $max_restarts)" >&2
  set +e
  env_args=()
  [ -n "${RUST_LOG:-}" ] && env_args=(-x RUST_LOG)
  mpirun -np "$ranks" --host "$host_list" --bind-to none --map-by "ppr:$per_host:node" \
    "${env_args[@]}" "${mpirun_args[@]}" "$@" "${resume[@]}"
  code=$?
  set -e
  case "$code" in
    0) exit 0 ;;
    75) echo "elastic-launch: stopped as asked (SIGTERM); every rank checkpointed" >&2; exit 75 ;;
  esac
  if [ "$restarts" -ge "$max_restarts" ]; then
    echo "elastic-launch: the job failed (exit $code) and the $max_restarts restarts are used up" >&2
    exit "$code"
  fi
  survivors=()
  for h in "${alive[@]}"; do
    if timeout 30 mpirun -np 1 --host "$h" true >/dev/null 2>&1; then
      survivors+=("$h")
    else
      echo "elastic-launch: host $h does not answer; dropped" >&2
    fi
  done
  if [ "${#survivors[@]}" -eq 0 ]; then
    echo "elastic-launch: the job failed (exit $code) and no host answers" >&2
    exit "$code"
  fi
  alive=("${survivors[@]}")
  resume=(--resume)
  restarts=$((restarts + 1))
done
