#!/usr/bin/env bash
# Bad flags, configurations and inputs through the binary: each gets its own message naming
# what to change and exit code 2; a corrupt feature file met mid-run stops the run without
# leaving a half-written checkpoint.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/train_errors"; rm -rf "$W"; mkdir -p "$W"
BASE="$(train_args "$DATA" "$W/out") --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 --max-steps 2"

expect2() {  # expect2 PATTERN ARGS...: exit code 2, a ---> HINT line and PATTERN in the output
  local pat="$1"; shift
  expect_usage_error "$pat" "$BIN" "$@"
  grep -qi -- "$pat" <<<"$out" || { echo "$out" | tail -5; fail "message lacks '$pat' for: $*"; }
  echo "ok: $pat"
}
expect2 "--learning-rate" $BASE --learning-rate fast
expect2 "--draft-global-batch-size" $BASE --draft-global-batch-size 5
expect2 "--target-model-path" $BASE --target-model-path /nonexistent/target
expect2 "--train-hidden-states-path" $BASE --train-hidden-states-path /nonexistent/features
expect2 "sharding-strategy" $BASE --sharding-strategy zero9
# The fused CUDA kernels on a CPU run: refused before any data is read.
expect2 "--fused-cuda-kernels" $BASE --device cpu --fused-cuda-kernels true
# An option that needs another, given alone, would do nothing (docs/configuration.md).
expect2 "without --lora-rank" $BASE --lora-alpha 8
expect2 "without --packing" $BASE --packing-budget 4096
# A LoRA rank above min(in, out) of a targeted projection: refused from the draft config.
expect2 "above min(in, out)" $BASE --lora-rank 4000
expect2 "micro-batches per rank for one optimizer step" $BASE --draft-global-batch-size 512
# An evaluation set smaller than one micro-batch per rank stops the run before training.
mkdir -p "$W/tiny_eval/rows_0-1"
cp "$(head -n 1 <<<"$(ls "$DATA"/eval_hidden_states/rows_*/*.ckpt)")" "$W/tiny_eval/rows_0-1/"
expect_usage_error "a too small eval set" "$BIN" $BASE --eval-hidden-states-path "$W/tiny_eval"
grep -qF "has 1 samples" <<<"$out" && ! grep -q "^step 1" <<<"$out" || { echo "$out" | tail -5; fail "a too small eval set"; }
expect2 "--config" --config /nonexistent/run.yaml
expect2 "is a directory" --config "$W"
expect2 "given 2 times" --config "$W/a.yaml" --config "$W/b.yaml"
expect2 "is a directory" $BASE --deepspeed "$W"
# run_config.yaml records absolute paths: --config of it works from any directory.
(cd "$W" && "$BIN" $(train_args "$DATA" "$W/x" | sed 's|--output-dir [^ ]*|--output-dir rel_out|') \
  --max-steps 1 >"$W/rel.log" 2>&1) || { tail "$W/rel.log"; fail "run with a relative --output-dir"; }
grep -q "^output_dir: \"$W/rel_out\"" "$W/rel_out/run_config.yaml" || { cat "$W/rel_out/run_config.yaml"; fail "run_config.yaml has a relative output_dir"; }
printf 'learning_rat: 0.1\n' >"$W/typo.yaml"
expect2 "learning_rate" --config "$W/typo.yaml"
printf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}\n' >"$W/ds.json"
expect2 "nvme" $BASE --deepspeed "$W/ds.json"
expect2 "--output-dir" $(train_args "$DATA" "$W/x" | sed 's/--output-dir [^ ]*//') --max-steps 1
cp -r "$DATA/target" "$W/nan_target"
"$PY" - "$W/nan_target" <<'PYEOF' || fail "writing a NaN target"
import json, sys
from safetensors.torch import load_file, save_file
d = sys.argv[1]
f = f'{d}/{json.load(open(f"{d}/model.safetensors.index.json"))["weight_map"]["lm_head.weight"]}'
t = load_file(f); t["lm_head.weight"][3, 1] = float("nan"); save_file(t, f, metadata={"format": "pt"})
PYEOF
expect2 "lm_head.weight' in $W/nan_target contains NaN" $BASE --target-model-path "$W/nan_target"
# A target that stores no LM head (tied embeddings, as Hugging Face saves SmolLM2 or Qwen3-0.6B):
# an error while its config.json does not say tie_word_embeddings: true, then the embedding.
mkdir -p "$W/tied_target"
"$PY" - "$DATA/target" "$W/tied_target" <<'PYEOF' || fail "writing a tied target"
import json, sys
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1:]
idx = json.load(open(f"{src}/model.safetensors.index.json"))["weight_map"]
emb = load_file(f"{src}/{idx['model.embed_tokens.weight']}")["model.embed_tokens.weight"]
save_file({"model.embed_tokens.weight": emb}, f"{dst}/model.safetensors", metadata={"format": "pt"})
cfg = json.load(open(f"{src}/config.json")); cfg["tie_word_embeddings"] = False
json.dump(cfg, open(f"{dst}/config.json", "w"))
PYEOF
expect2 "no tensor named 'lm_head.weight' in the checkpoint, and its config.json says tie_word_embeddings: false" \
  $BASE --target-model-path "$W/tied_target"
sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$W/tied_target/config.json"
out="$("$BIN" $BASE --target-model-path "$W/tied_target" --max-steps 1 --output-dir "$W/tied_out" 2>&1)" &&
  grep -qE "tied.*'model.embed_tokens.weight'" <<<"$out" &&
  grep -q "^step 1" <<<"$out" || { echo "$out" | tail -5; fail "a tied target"; }
echo "ok: tied target"
# Loss masks (docs/data.md "Loss masks"): all-zero in every sample, and a single loss token in
# the whole set (below the 0.1% minimum), are refused at start-up with exit 2, the counts and a
# hint; 3 of 8 samples without a loss token train, and the epoch summary counts them.
zero_masks() {  # zero_masks SRC DST KEEP_FIRST N_ZERO: copies SRC's .ckpt files, zeroes masks
  "$PY" - "$@" <<'PYEOF' || fail "writing zero loss masks"
import glob, os, shutil, sys, torch
src, dst, keep_first, n_zero = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
files = sorted(glob.glob(f"{src}/**/*.ckpt", recursive=True))
for i, f in enumerate(files):
    out = os.path.join(dst, os.path.relpath(f, src)); os.makedirs(os.path.dirname(out), exist_ok=True)
    d = torch.load(f, weights_only=True)
    if n_zero < 0 or i < n_zero:
        d["loss_mask"] = torch.zeros_like(d["loss_mask"])
        if keep_first and i == 0:
            d["loss_mask"].view(-1)[1] = 1
    torch.save(d, out)
PYEOF
}
zero_masks "$DATA/hidden_states" "$W/zero_mask" 0 -1
expect_usage_error "all-zero loss masks" "$BIN" $BASE --train-hidden-states-path "$W/zero_mask"
[ "$(grep -c "(0 loss tokens in" <<<"$out")" -eq 1 ] &&
  [ "$(grep -c -- "---> HINT:.*loss-mask convention" <<<"$out")" -eq 1 ] && [ "$(grep -c "^step " <<<"$out")" -eq 0 ] ||
  { tail -5 <<<"$out"; fail "all-zero loss masks"; }
echo "ok: all-zero loss masks"
zero_masks "$DATA/hidden_states" "$W/one_loss_token" 1 -1
expect_usage_error "one loss token in the set" "$BIN" $BASE --train-hidden-states-path "$W/one_loss_token"
[ "$(grep -c "(1 loss tokens in .*0.1%" <<<"$out")" -eq 1 ] || { tail -5 <<<"$out"; fail "one loss token in the set"; }
echo "ok: loss-token share below the minimum"
mkdir -p "$W/few_src/rows_0"
cp $(head -n 8 <<<"$(ls "$DATA"/hidden_states/rows_*/*.ckpt | sort)") "$W/few_src/rows_0/"
zero_masks "$W/few_src" "$W/some_zero" 0 3
out="$("$BIN" $(train_args "$DATA" "$W/some_zero_out") --train-hidden-states-path "$W/some_zero" \
  --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "3 of 8 samples without any" <<<"$out")" -eq 1 ] ||
  { tail -5 <<<"$out"; fail "3 of 8 samples without a loss token: exit $rc"; }
"$PY" - "$W/some_zero_out/metrics.jsonl" <<'PYEOF' || fail "epoch summary without zero_loss_samples 3"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "train_epoch/zero_loss_samples" in r]
assert len(rows) == 1 and rows[0]["train_epoch/zero_loss_samples"] == 3, rows
PYEOF
echo "ok: samples without a loss token counted per epoch"
sed 's/"hidden_size": [0-9]*/"hidden_size": 96/' "$DATA/draft_config.json" >"$W/bad_draft.json"
expect2 "hidden" $BASE --draft-model-config "$W/bad_draft.json"

# A corrupt feature file in the middle of the data: exit 2 naming the file; every checkpoint
# directory left behind is complete.
cp -r "$DATA" "$W/data"
# Without the shared data's cached mappings (other tests' runs leave theirs there, e.g. the one of
# e2e.specforge_flags' made draft config, whose draft vocabulary is the full 512), so the warm-up
# run's mapping is the only one below. Which one `ls | head` met first was a draw: the names hash
# the data's path and its files' modification times.
rm -rf "$W/data/cache"
victim="$(ls "$W"/data/hidden_states/rows_*/*.ckpt | sort | sed -n 40p)"
cp "$victim" "$W/victim.good"
# The vocabulary mapping of the intact data (a run that computes it reads every file and stops
# at start-up on the bad one, which the first case below checks).
"$BIN" $(train_args "$W/data" "$W/warm") --max-steps 1 >"$W/warm.log" 2>&1 || { tail "$W/warm.log"; fail "warm-up run"; }
VMAP="$(head -n 1 <<<"$(ls "$W"/data/cache/vocab_mapping/*.pt)")"
head -c 300 "$victim" >"$victim.tmp" && mv "$victim.tmp" "$victim"
expect_usage_error "the vocabulary pass on a bad file" "$BIN" $(train_args "$W/data" "$W/startup") --num-epochs 1
grep -q "$(basename "$victim")" <<<"$out" || { echo "$out" | tail; fail "the vocabulary pass did not stop on the bad file"; }
grep -q "^step " <<<"$out" && fail "trained although the vocabulary pass met a bad file"
# Met mid-run (the mapping given) with no periodic saves: the run saves its last completed step
# before stopping, and after the file is repaired --resume continues from there.
expect_usage_error "corrupt input (no periodic saves)" "$BIN" $(train_args "$W/data" "$W/keep") --vocab-mapping-path "$VMAP" \
  --draft-global-batch-size 2 --draft-micro-batch-size 2 --num-epochs 1 --save-interval 0
grep -qE "bad sample.*saving step" <<<"$out" || { echo "$out" | tail; fail "no save before stopping"; }
K="$(latest_ckpt "$W/keep")"
[ -f "$K/COMPLETE" ] || fail "no complete checkpoint after the bad sample"
# At 2 ranks: the rank that reads the file names it (whichever rank that is), both ranks save.
expect_usage_error "2 ranks: bad sample" run_np 2 $(train_args "$W/data" "$W/keep2r") --vocab-mapping-path "$VMAP" \
  --draft-global-batch-size 4 --draft-micro-batch-size 2 --num-epochs 1 --save-interval 0
grep -q "$(basename "$victim"): cannot load" <<<"$out" || { echo "$out" | tail; fail "2 ranks: bad sample not named"; }
[ -f "$(latest_ckpt "$W/keep2r")/COMPLETE" ] || { echo "$out" | tail; fail "2 ranks: no checkpoint after the bad sample"; }
# A damaged evaluation file (not the first: that one is read at start-up) met by an --eval-steps
# evaluation at 2 ranks: the step is saved first, then the run stops naming the file.
cp -r "$DATA/eval_hidden_states" "$W/bad_eval"
ev="$(ls "$W"/bad_eval/rows_*/*.ckpt | sort | sed -n 5p)"
head -c 300 "$W/victim.good" >"$ev"
expect_usage_error "2 ranks: bad evaluation file" run_np 2 $(train_args "$DATA" "$W/evalbad") --draft-global-batch-size 4 \
  --draft-micro-batch-size 2 --num-epochs 1 --save-interval 0 --eval-steps 2 --eval-interval 0 \
  --eval-hidden-states-path "$W/bad_eval"
grep -q "$(basename "$ev"): cannot load" <<<"$out" && grep -qE "evaluation.*saving step 2" <<<"$out" ||
  { echo "$out" | tail; fail "2 ranks: bad evaluation file"; }
[ -f "$W/evalbad/epoch_0_step_2/COMPLETE" ] || { ls "$W/evalbad"; fail "no checkpoint of step 2 before the evaluation error"; }
cp "$W/victim.good" "$victim"
"$BIN" $(train_args "$W/data" "$W/keep") --vocab-mapping-path "$VMAP" --draft-global-batch-size 2 \
  --draft-micro-batch-size 2 --num-epochs 1 --save-interval 0 --max-steps $(( ${K##*_step_} + 1 )) --resume >"$W/keep2.log" 2>&1 ||
  { tail "$W/keep2.log"; fail "resume after repairing the file"; }
grep -q "resumed from $K" "$W/keep2.log" || fail "did not resume from $K"
head -c 300 "$W/victim.good" >"$victim"
expect_usage_error "corrupt input" "$BIN" $(train_args "$W/data" "$W/corrupt") --vocab-mapping-path "$VMAP" \
  --draft-global-batch-size 2 --draft-micro-batch-size 2 --num-epochs 1 --save-steps 1
grep -q "$(basename "$victim")" <<<"$out" || { echo "$out" | tail; fail "message does not name $victim"; }
for d in "$W"/corrupt/epoch_*; do
  [ -d "$d" ] || continue
  [ -f "$d/COMPLETE" ] || fail "incomplete checkpoint $d"
done
grep -q '^\.tmp_' <<<"$(ls -a "$W/corrupt")" && fail "temporary checkpoint directory left behind"
# With --skip-bad-samples the same data trains through and reports the skipped sample.
out="$("$BIN" $(train_args "$W/data" "$W/skip") --draft-global-batch-size 2 --draft-micro-batch-size 2 \
  --num-epochs 1 --skip-bad-samples 2>&1)"; rc=$?
[ $rc -eq 0 ] || { echo "$out" | tail; fail "--skip-bad-samples run exited $rc"; }
grep -qi "skipped" <<<"$out" || { echo "$out" | tail; fail "no skipped-sample summary"; }
echo PASS
