#!/usr/bin/env bash
# Another SpecForge version's command line through the binary: --batch-size,
# --draft-accumulation-steps, --log-interval, --max-num-steps and the no-effect flags train to
# bitwise the same weights as our own flags, with --profile on (profiling changes nothing); the
# trace names the phases; the flags are recorded; refused and unknown flags exit 2 with the
# reason; SGLANG_TORCH_PROFILER_DIR is where SpecForge users look for traces; a repository id
# and no draft config (SpecForge's example scripts) work.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/specforge_flags"; rm -rf "$W"; mkdir -p "$W"
COMMON="--mixed-precision fp32 --export-dtype fp32 --num-epochs 1 --save-interval 0"
# train_args without its --log-steps (an alias and its option given differently is an error).
sf_args() { train_args "$@" | sed 's/--log-steps 1//'; }

run_np 1 $(sf_args "$DATA" "$W/sf") $COMMON --batch-size 2 --draft-accumulation-steps 2 \
  --log-interval 2 --max-num-steps 4 --tp-size 1 --attention-backend flex_attention \
  --build-dataset-num-proc 8 --cache-key k1 --chat-template llama3 --is-preformatted \
  --profile --profile-start-step 1 --profile-num-steps 2 >"$W/sf.log" 2>&1 || { cat "$W/sf.log"; fail "SpecForge-style command line"; }
run_np 1 $(sf_args "$DATA" "$W/ours") $COMMON --draft-micro-batch-size 2 \
  --draft-global-batch-size 4 --log-steps 2 --max-steps 4 >"$W/ours.log" 2>&1 || { cat "$W/ours.log"; fail "same run with fsdp-train's flags"; }
compare_exports "$(latest_ckpt "$W/sf")" "$(latest_ckpt "$W/ours")" 0 || fail "SpecForge spellings or --profile changed training"
grep -q "accumulation 2, " "$W/sf.log" || fail "--batch-size 2 --draft-accumulation-steps 2 at 1 rank should accumulate 2"

"$PY" - "$W/sf" <<'PYEOF' || fail "profile, metrics or recorded flags"
import json, sys
run = sys.argv[1]
trace = json.load(open(f"{run}/profile/rank0.trace.json"))
names = [e.get("name") for e in trace["traceEvents"]]
# Steps 2 and 3 (after step 1, two steps) with accumulation 2: 4 micro-batches, 2 optimizer steps.
assert names.count("fsdp::optimizer_step") == 2, names.count("fsdp::optimizer_step")
assert names.count("fsdp::forward") == 4 and names.count("fsdp::backward") == 4
assert "aten::mm" in names
summary = open(f"{run}/profile/rank0.summary.txt").read()
assert "fsdp::backward" in summary, summary
steps = [json.loads(l)["step"] for l in open(f"{run}/metrics.jsonl") if '"train/ploss_0"' in l]
assert steps == [2, 4], steps
assert "# SpecForge flags given (no effect): --attention-backend flex_attention " \
       "--build-dataset-num-proc 8 --cache-key k1 --is-preformatted true --tp-size 1" \
       in open(f"{run}/run_config.yaml").read()
print("profile and recorded flags: ok")
PYEOF

# SpecForge writes traces to $SGLANG_TORCH_PROFILER_DIR; so does fsdp-train when it is set.
SGLANG_TORCH_PROFILER_DIR="$W/sglang_traces" run_np 1 $(train_args "$DATA" "$W/env") $COMMON \
  --max-num-steps 1 --draft-global-batch-size 2 --draft-micro-batch-size 2 --profile \
  --profile-start-step 0 --profile-num-steps 1 >"$W/env.log" 2>&1 || { cat "$W/env.log"; fail "profile into SGLANG_TORCH_PROFILER_DIR"; }
[ -s "$W/sglang_traces/rank0.trace.json" ] || fail "no trace in SGLANG_TORCH_PROFILER_DIR"

# A SpecForge output directory (epoch_<N>/ with config.json + model.safetensors, no optimizer
# state): --resume refuses to start over next to it and names --init-checkpoint/--ckpt-dir,
# which start from its weights.
mkdir -p "$W/sfout/epoch_0"
cp "$(latest_ckpt "$W/ours")"/{config.json,model.safetensors} "$W/sfout/epoch_0/"
expect_usage_error "--resume next to SpecForge checkpoints" "$BIN" $(sf_args "$DATA" "$W/sfout") $COMMON --max-num-steps 1 --resume
grep -qF "without optimizer state ($W/sfout/epoch_0)" <<<"$out" || { echo "$out"; fail "no reason for refusing --resume"; }
expect_usage_error "--resume PATH of weights only" "$BIN" $(sf_args "$DATA" "$W/sfout") $COMMON --max-num-steps 1 --resume "$W/sfout/epoch_0"
grep -q -- "--init-checkpoint $W/sfout/epoch_0" <<<"$out" || { echo "$out"; fail "--resume PATH of weights only should name --init-checkpoint"; }
run_np 1 $(sf_args "$DATA" "$W/sfout") $COMMON --max-num-steps 1 --draft-global-batch-size 2   --draft-micro-batch-size 2 --ckpt-dir "$W/sfout/epoch_0" --resume >"$W/sfinit.log" 2>&1 || { cat "$W/sfinit.log"; fail "--ckpt-dir from a SpecForge checkpoint"; }
grep -q "no complete checkpoint" "$W/sfinit.log" || { cat "$W/sfinit.log"; fail "--ckpt-dir with --resume should start from the weights"; }

# SpecForge's example scripts: a repository id as --target-model-path (found in the Hugging Face
# cache, here a copy of the toy target laid out as huggingface_hub does) and no
# --draft-model-config (made from the target's config.json into the cache; trains, and is what
# the checkpoint records).
mkdir -p "$W/hub/models--toy--target/snapshots/0a1b" "$W/hub/models--toy--target/refs"
cp "$DATA"/target/* "$W/hub/models--toy--target/snapshots/0a1b/"
printf 0a1b >"$W/hub/models--toy--target/refs/main"
HF_HUB_CACHE="$W/hub" run_np 1 $(sf_args "$DATA" "$W/auto" | sed 's/--draft-model-config [^ ]*//; s|--target-model-path [^ ]*|--target-model-path toy/target|') \
  $COMMON --max-num-steps 1 --draft-global-batch-size 2 --draft-micro-batch-size 2 >"$W/auto.log" 2>&1 ||
  { cat "$W/auto.log"; fail "a run with a repository id and without --draft-model-config"; }
grep -q "target-model-path toy/target: .*$W/hub/models--toy--target/snapshots/0a1b" "$W/auto.log" ||
  { cat "$W/auto.log"; fail "the repository id was not resolved through HF_HUB_CACHE"; }
made="$(grep -m 1 -o "no --draft-model-config: made [^ ]*" "$W/auto.log" | cut -d' ' -f4)"
[ -f "$made" ] && [ "${made#"$DATA/cache/draft_configs/target-eagle3-auto-"}" != "$made" ] ||
  { cat "$W/auto.log"; fail "no made draft config under the cache: '$made'"; }
"$PY" - "$made" "$(latest_ckpt "$W/auto")/config.json" <<'PYEOF' || fail "made draft config"
import json, sys
made, saved = (json.load(open(p)) for p in sys.argv[1:])
# The toy target: hidden 64, 2 heads, intermediate 128, vocab 512 (< 32000: all of it drafted).
assert (made["hidden_size"], made["num_attention_heads"], made["intermediate_size"],
        made["vocab_size"], made["draft_vocab_size"]) == (64, 2, 128, 512, 512), made
assert saved["hidden_size"] == 64 and saved["draft_vocab_size"] == 512, saved
PYEOF
# Continuing it without --draft-model-config takes the checkpoint's own config, not a new one.
HF_HUB_CACHE="$W/hub" run_np 1 $(sf_args "$DATA" "$W/auto" | sed 's/--draft-model-config [^ ]*//; s|--target-model-path [^ ]*|--target-model-path toy/target|') \
  $COMMON --max-num-steps 2 --draft-global-batch-size 2 --draft-micro-batch-size 2 --resume >"$W/auto2.log" 2>&1 ||
  { cat "$W/auto2.log"; fail "resuming without --draft-model-config"; }
grep -q -- "--draft-model-config: using $W/auto/epoch_0_step_1/config.json" "$W/auto2.log" ||
  { cat "$W/auto2.log"; fail "the resume did not take the checkpoint's draft config"; }

# Refused and unknown flags: exit 2, the reason and a ---> HINT line.
expect_refusal() {
  local needle="$1"; shift
  expect_usage_error "$*" "$BIN" $(train_args "$DATA" "$W/refused") "$@"
  grep -qF -- "$needle" <<<"$out" || { echo "$out"; fail "$*: no '$needle'"; }
}
expect_refusal "nothing to split" --tp-size 2
expect_refusal "sequence parallelism" --attention-backend usp
expect_refusal "SwanLab tracker is not supported" --report-to none --swanlab-project p
expect_refusal "online target model" --sglang-mem-fraction-static 0.5
expect_refusal "did you mean --learning-rate?" --learnin-rate 1e-4
expect_refusal "disagree" --log-interval 5 --log-steps 7
[ ! -d "$W/refused" ] || fail "a refused command line created its output directory"
echo "specforge_flags: ok"
