#!/usr/bin/env bash
# Runs shard_bench at 1, 2 and 4 ranks (4 ranks with FSDP_PRETEND_NODES=2 for HYBRID_SHARD) and
# prints the markdown tables for docs/benchmarks.md. Usage: benchmarks/shard/run.sh BUILD_DIR [args]
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [--steps N --warmup N --dtype fp32|bf16]}
shift
bin=$build/benchmarks/shard_bench
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
for np in 1 2 4; do
  if [ "$np" = 4 ]; then
    FSDP_PRETEND_NODES=2 OMP_NUM_THREADS=1 "${mpi[@]}" -x FSDP_PRETEND_NODES -n "$np" "$bin" "$@"
  else
    OMP_NUM_THREADS=1 "${mpi[@]}" -n "$np" "$bin" "$@"
  fi
done
