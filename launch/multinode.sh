#!/usr/bin/env bash
# Multi-node launch with mpirun and a hostfile: N ranks per node on every node of the hostfile,
# one rank per GPU.
#   launch/multinode.sh --hostfile FILE --nproc-per-node N [--nnodes K] -- <fsdp-train flags>
# K defaults to the number of nodes in the hostfile. fsdp-train's launcher passes to every rank,
# by name (mpirun -x VAR: no value on the command line), every set variable whose name starts
# with FSDP_, NCCL_, WANDB_ or MLFLOW_, plus OMP_NUM_THREADS and LD_LIBRARY_PATH. Environment that matters:
#   NCCL_SOCKET_IFNAME   network interface NCCL bootstraps on (e.g. eth0, ib0, ^lo,docker)
#   NCCL_IB_HCA, NCCL_IB_DISABLE, NCCL_DEBUG=INFO   InfiniBand selection and diagnostics
#   OMP_NUM_THREADS      CPU threads per rank (default: the node's cores divided by its ranks)
#   FSDP_LOG_LEVEL, FSDP_PRETEND_NODES (tests: split one machine into pretend nodes)
# --dist-timeout (minutes) bounds every collective; a missing rank aborts the job with its name.
# With --sharding-strategy hybrid_shard parameters are sharded inside each node and replicated
# across nodes: ZeRO-3 traffic stays on the node's fast links.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${FSDP_BIN:-$REPO/build/fsdp-train}"
hostfile="" nproc="" nnodes=""
# usage_error MESSAGE HINT: our error format (an error line and a HINT line), exit 2.
usage_error() { printf 'multinode.sh: error: %s\n---> HINT: %s\n' "$1" "$2" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) hostfile="$2"; shift 2 ;;
    --nproc-per-node) nproc="$2"; shift 2 ;;
    --nnodes) nnodes="$2"; shift 2 ;;
    --) shift; break ;;
    *) usage_error "unknown option '$1'" "put fsdp-train flags after --" ;;
  esac
done
[ -n "$hostfile" ] && [ -r "$hostfile" ] ||
  usage_error "--hostfile FILE is required and must be readable" "give a readable mpirun hostfile, one node per line (docs/multi-node.md)"
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] ||
  usage_error "--nproc-per-node N (positive integer) is required" "give the ranks per node, e.g. --nproc-per-node 8 (one per GPU)"
if [ -z "$nnodes" ]; then
  nnodes=$(grep -Ev '^\s*(#|$)' "$hostfile" | wc -l)
fi
[ -x "$BIN" ] || usage_error "$BIN not found" "build first (bash launch/setup.sh) or set FSDP_BIN"
for v in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE NCCL_DEBUG FSDP_LOG_LEVEL FSDP_PRETEND_NODES; do
  [ -n "${!v:-}" ] && export "$v"
done
echo "[multinode] $nnodes node(s) x $nproc rank(s) from $hostfile"
exec "$BIN" --nproc-per-node "$nproc" --nnodes "$nnodes" --hostfile "$hostfile" "$@"
