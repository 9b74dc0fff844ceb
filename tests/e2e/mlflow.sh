#!/usr/bin/env bash
# --report-to mlflow end to end: a run logs to a local MLflow file store (read back with MLflow's
# own client: one train/loss entry per step, the configuration as params), a --resume continues
# the same MLflow run (its id is kept in the checkpoint), MLflow's environment variables stand in
# for the flags next to TensorBoard, and a Python without mlflow is a clear start-up error.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
# launch/setup.sh installs mlflow: a venv without it is a broken setup, so the test fails.
"$PY" -c "import mlflow" 2>/dev/null ||
  fail "package mlflow is not installed in the venv of $PY (launch/setup.sh installs it)"
export FSDP_PYTHON="$PY"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/mlflow"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --draft-global-batch-size 4 --draft-micro-batch-size 2 --save-interval 0 --num-epochs 1"
ML="--report-to mlflow --mlflow-tracking-uri file://$W/mlruns --mlflow-experiment-name e2e --mlflow-run-name part"

for steps in 3 6; do
  "$BIN" $(train_args "$DATA" "$W/run") $COMMON --max-steps $steps --resume $ML >"$W/run$steps.log" 2>&1 ||
    { cat "$W/run$steps.log"; fail "MLflow run to step $steps"; }
done
grep -q "resumed from .*epoch_0_step_3" "$W/run6.log" || fail "the second part did not resume from step 3"
"$PY" - "$W" <<'PYEOF' || fail "the MLflow run read back"
import json, os, sys
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from mlflow.tracking import MlflowClient
w = sys.argv[1]
ids = [json.load(open(f"{w}/run/epoch_0_step_{s}/trainer_state.json")).get("mlflow_run_id") for s in (3, 6)]
assert ids[0] and ids[0] == ids[1], ids
c = MlflowClient(f"file://{w}/mlruns")
exp = c.get_experiment_by_name("e2e")
runs = c.search_runs([exp.experiment_id])
assert [r.info.run_id for r in runs] == [ids[0]], [r.info.run_id for r in runs]
run = runs[0]
assert run.info.run_name == "part" and run.info.status == "FINISHED", run.info
steps = [m.step for m in c.get_metric_history(ids[0], "train/loss")]
assert steps == [1, 2, 3, 4, 5, 6], steps
jsonl = {r["step"]: r["train/loss"] for r in map(json.loads, open(f"{w}/run/metrics.jsonl")) if "train/loss" in r}
for m in c.get_metric_history(ids[0], "train/loss"):
    assert abs(m.value - jsonl[m.step]) <= 1e-6 * max(1.0, abs(m.value)), (m, jsonl)
params = run.data.params
assert len(params) > 20 and any("learning_rate" in k for k in params), sorted(params)
assert all(len(v) <= 6000 for v in params.values())
assert not any("wandb_key" in k for k in params), sorted(params)
assert run.data.tags.get("fsdp-train.resumed_from_step") == "3", run.data.tags
print("both parts logged to MLflow run", ids[0], "steps", steps, len(params), "params")
PYEOF

# TensorBoard and MLflow together; the MLflow place and experiment from MLflow's variables.
MLFLOW_TRACKING_URI="file://$W/mlruns_env" MLFLOW_EXPERIMENT_NAME=from-env \
  "$BIN" $(train_args "$DATA" "$W/both") $COMMON --max-steps 2 --report-to tensorboard,mlflow \
  >"$W/both.log" 2>&1 || { cat "$W/both.log"; fail "tensorboard,mlflow run"; }
ls "$W/both/tensorboard"/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard events next to MLflow"
"$PY" - "$W" <<'PYEOF' || fail "the MLflow run of MLFLOW_TRACKING_URI"
import os, sys
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from mlflow.tracking import MlflowClient
c = MlflowClient(f"file://{sys.argv[1]}/mlruns_env")
runs = c.search_runs([c.get_experiment_by_name("from-env").experiment_id])
assert len(runs) == 1, runs
assert [m.step for m in c.get_metric_history(runs[0].info.run_id, "train/loss")] == [1, 2]
print("tensorboard,mlflow: run", runs[0].info.run_id)
PYEOF

# A Python whose mlflow cannot be imported: the run stops at start-up and says what to install.
mkdir -p "$W/no_mlflow/mlflow"
echo 'raise ImportError("not installed")' >"$W/no_mlflow/mlflow/__init__.py"
out="$(PYTHONPATH="$W/no_mlflow" "$BIN" $(train_args "$DATA" "$W/missing") $COMMON --max-steps 2 \
  --report-to mlflow 2>&1)" && fail "a run without mlflow started"
grep -q "cannot import mlflow" <<<"$out" || { echo "$out"; fail "no 'cannot import mlflow'"; }
grep -q "pip install mlflow-skinny" <<<"$out" || { echo "$out"; fail "no install hint"; }
echo PASS
