#!/usr/bin/env bash
# SpecForge's typed run file (`specforge train -c run.yaml section.key=value`) end to end
# (docs/migration-from-specforge.md): each of SpecForge's example offline EAGLE3 configs trains
# with its paths replaced; a typed file trains the same fp32 weights as the flags it maps to, at
# 1 and 2 ranks (per-rank batch_size); specforge train's semantics (max_steps as the LR horizon,
# the draft config made from the target's own fields) differ from the offline script's where
# they should; bad keys and overrides are refused with exit code 2.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/specforge_yaml"; rm -rf "$W"; mkdir -p "$W"
TOY="--device cpu --threads 1"

# 1. SpecForge's examples, paths replaced (their key sets: tests/data/specforge_configs). The toy
# target's embedding is model.embed_tokens.weight and the vocab mapping is counted from the
# features, so those two keys are overridden like the training length.
for f in "$SRC"/tests/data/specforge_configs/*.yaml; do
  name=$(basename "$f" .yaml)
  sed -e "s|@TARGET@|$DATA/target|; s|@DRAFT@|$DATA/draft_config.json|; s|@VOCAB@||" \
      -e "s|@FEATURES@|$DATA/hidden_states|; s|@CACHE@|$W/cache|; s|@OUT@|$W/ex/$name|g" \
      "$f" >"$W/$name.yaml"
  "$BIN" -c "$W/$name.yaml" training.max_steps=2 data.max_length=64 training.ttt_length=3 \
    model.embedding_key=model.embed_tokens.weight $TOY >"$W/$name.log" 2>&1 \
    || { tail -20 "$W/$name.log"; fail "SpecForge's $name.yaml"; }
  [ -f "$(latest_ckpt "$W/ex/$name")/model.safetensors" ] || fail "$name.yaml saved no checkpoint"
  grep -q "SpecForge's typed schema" "$W/$name.log" || fail "$name.yaml was not read as the typed schema"
done
# The 8-rank examples name their rank count; this run has one.
grep -q "asks for 8 rank(s)" "$W/deepseek-v3-671b-eagle3-offline.log" || fail "no warning about deployment.trainer"
grep -q "model.trust_remote_code = true" "$W/ling-flash-2.0-eagle3-offline.log" || fail "recorded key not listed"

# 2. A typed file trains the same weights as the flags it maps to (fp32), at 1 and 2 ranks.
cat >"$W/run.yaml" <<EOF
model:
  target_model_path: $DATA/target
  draft_model_config: $DATA/draft_config.json
data:
  hidden_states_path: $DATA/hidden_states
  max_length: 64
  cache_dir: $W/cache
training:
  batch_size: 2
  accumulation_steps: 2
  learning_rate: 1.0e-3
  warmup_ratio: 0.1
  ttt_length: 3
  max_steps: 5
  log_interval: 1
run_id: typed
EOF
FP32="--mixed-precision fp32 --export-dtype fp32"
FLAGS="--target-model-path $DATA/target --draft-model-config $DATA/draft_config.json \
  --train-hidden-states-path $DATA/hidden_states --max-length 64 --cache-dir $W/cache \
  --learning-rate 1e-3 --warmup-ratio 0.1 --ttt-length 3 --max-steps 5 --total-steps 5 \
  --log-steps 1 --seed 42 --num-epochs 1 --sharding-strategy shard_grad_op --save-interval 0 \
  --dist-timeout 10 --draft-micro-batch-size 2"
for np in 1 2; do
  run_np $np -c "$W/run.yaml" output_dir="$W/typed$np" $FP32 $TOY >"$W/typed$np.log" 2>&1 \
    || { tail -20 "$W/typed$np.log"; fail "typed file at $np rank(s)"; }
  run_np $np $FLAGS --draft-global-batch-size $((4 * np)) --output-dir "$W/flags$np" $FP32 $TOY \
    >"$W/flags$np.log" 2>&1 || { tail -20 "$W/flags$np.log"; fail "flags at $np rank(s)"; }
  compare_exports "$(latest_ckpt "$W/typed$np")" "$(latest_ckpt "$W/flags$np")" 0 \
    || fail "typed file and its flags differ at $np rank(s)"
done
# batch_size is per rank: 2 x ranks x 2 samples per optimizer step.
grep -q "draft_global_batch_size: 8" "$W/typed2/run_config.yaml" || fail "2 ranks: global batch is not 8"
grep -q "seed: 42" "$W/typed1/run_config.yaml" || fail "SpecForge's seed 42 not applied"

# 3. specforge train's LR horizon is max_steps (the LR decays to ~0 at the cap); the offline
# script's (the flags) is the epochs' steps: the same cap leaves the LR high.
"$PY" - "$W/typed1/metrics.jsonl" "$W/capped.txt" <<'PYEOF' || fail "max_steps is not the LR horizon"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train/lr"' in l]
last = rows[-1]["train/lr"]
assert last < 0.2e-3, last
PYEOF
"$BIN" $FLAGS --total-steps none --draft-global-batch-size 4 --output-dir "$W/script" $FP32 $TOY \
  >"$W/script.log" 2>&1 || { tail -20 "$W/script.log"; fail "flags without --total-steps"; }
"$PY" - "$W/script/metrics.jsonl" <<'PYEOF' || fail "the offline script's horizon changed"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train/lr"' in l]
assert rows[-1]["train/lr"] > 0.9e-3, rows[-1]["train/lr"]
PYEOF

# 4. The draft config made from the target: specforge train copies the target's fields (RoPE
# base, initializer_range); the offline script's template does not.
mkdir -p "$W/target"
cp "$DATA"/target/* "$W/target/"
"$PY" - "$W/target/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1])); c["rope_theta"] = 50000.0; c["initializer_range"] = 0.01
json.dump(c, open(sys.argv[1], "w"), indent=2)
PYEOF
sed -e "s|$DATA/target|$W/target|" -e "/draft_model_config/d" "$W/run.yaml" >"$W/auto.yaml"
"$BIN" -c "$W/auto.yaml" output_dir="$W/auto" training.max_steps=1 $TOY >"$W/auto.log" 2>&1 \
  || { tail -20 "$W/auto.log"; fail "typed file without a draft config"; }
"$PY" - "$(latest_ckpt "$W/auto")/config.json" <<'PYEOF' || fail "the made draft config lacks the target's fields"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["rope_theta"] == 50000.0 and c["initializer_range"] == 0.01, c
PYEOF
"$BIN" --target-model-path "$W/target" --train-hidden-states-path "$DATA/hidden_states" \
  --cache-dir "$W/cache" --output-dir "$W/auto_template" --max-length 64 --ttt-length 3 \
  --max-steps 1 $TOY >"$W/auto_template.log" 2>&1 || { tail -20 "$W/auto_template.log"; fail "flags without a draft config"; }
"$PY" - "$(latest_ckpt "$W/auto_template")/config.json" <<'PYEOF' || fail "the template took the target's RoPE base"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["rope_theta"] == 10000.0, c["rope_theta"]
PYEOF

# 5. Refusals: exit code 2 with a hint, naming the key.
printf 'model:\n  target_model_path: %s\ndata:\n  hidden_states_path: %s\ntraining:\n  learnig_rate: 1\n' \
  "$DATA/target" "$DATA/hidden_states" >"$W/bad.yaml"
expect_usage_error "unknown key" "$BIN" -c "$W/bad.yaml" $TOY
grep -q "training.learning_rate" <<<"$out" || { echo "$out"; fail "no closest key named"; }
expect_usage_error "bad override" "$BIN" -c "$W/run.yaml" training.num_epochs=x $TOY
grep -q "training.num_epochs" <<<"$out" || { echo "$out"; fail "the override's key is not named"; }
expect_usage_error "DFlash" "$BIN" -c "$W/run.yaml" training.strategy=dflash $TOY
expect_usage_error "override without a typed file" "$BIN" training.seed=1 $TOY
echo PASS
