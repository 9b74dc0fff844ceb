#!/usr/bin/env bash
# The multi-node recipes, run on one machine: launch/multinode.sh with a local hostfile and two
# pretend nodes (FSDP_PRETEND_NODES) training with hybrid sharding, and launch/slurm.sbatch with
# a stand-in `srun` that starts the tasks through mpirun (no Slurm here: this checks the
# script's environment and argument handling, not Slurm itself).
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/multinode"; rm -rf "$W"; mkdir -p "$W"
echo "localhost slots=4" >"$W/hostfile"
ARGS="$(train_args "$DATA" "$W/hybrid") --draft-global-batch-size 8 --draft-micro-batch-size 2 --num-epochs 1 --max-steps 3 --save-interval 0"

FSDP_BIN="$BIN" FSDP_PRETEND_NODES=2 bash "$SRC/launch/multinode.sh" --hostfile "$W/hostfile" \
  --nproc-per-node 4 --nnodes 1 -- $ARGS --sharding-strategy hybrid_shard >"$W/hybrid.log" 2>&1 ||
  { cat "$W/hybrid.log"; fail "multinode.sh with pretend nodes"; }
grep -q "4 rank(s) on 2 node(s)" "$W/hybrid.log" || { cat "$W/hybrid.log"; fail "not 4 ranks on 2 pretend nodes"; }
[ -f "$(latest_ckpt "$W/hybrid")/COMPLETE" ] || fail "no checkpoint from the hybrid run"
# Hybrid sharding saves one shard file per node-local rank (replicas write nothing):
# `fsdp-train export` reassembles them into bitwise the run's own bf16 export.
grep -q "shard_size 2" "$(latest_ckpt "$W/hybrid")/train_state/manifest.txt" || fail "hybrid manifest: not 2 shards"
"$BIN" export --checkpoint "$(latest_ckpt "$W/hybrid")" --output "$W/hybrid_export" --dtype bf16 >/dev/null || fail "export of the hybrid checkpoint"
compare_exports "$W/hybrid_export" "$(latest_ckpt "$W/hybrid")" 0 || fail "hybrid export differs"
expect_usage_error "missing --hostfile" bash "$SRC/launch/multinode.sh" --nproc-per-node 2 -- --help
grep -q -- "--hostfile" <<<"$out" || fail "missing --hostfile: the error does not name --hostfile"

# Slurm recipe with a stand-in srun.
mkdir -p "$W/bin"
cat >"$W/bin/srun" <<SRUN
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#--}" != "\$1" ]; do shift; done   # drop srun options
exec "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -n "\$SLURM_NTASKS" "\$@"
SRUN
chmod +x "$W/bin/srun"
ARGS="$(train_args "$DATA" "$W/slurm") --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 --max-steps 2 --save-interval 0"
PATH="$W/bin:$PATH" SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_JOB_ID=e2e FSDP_BIN="$BIN" \
  FSDP_SRUN_ARGS="--mpi=none" bash "$SRC/launch/slurm.sbatch" $ARGS >"$W/slurm.log" 2>&1 ||
  { cat "$W/slurm.log"; fail "slurm.sbatch"; }
grep -q "2 rank(s) on 1 node(s)" "$W/slurm.log" || fail "slurm run did not start 2 ranks"
[ -f "$(latest_ckpt "$W/slurm")/COMPLETE" ] || fail "no checkpoint from the slurm recipe"
echo PASS
