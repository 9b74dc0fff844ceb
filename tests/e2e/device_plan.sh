#!/usr/bin/env bash
# The GPU plan's CPU dry run (benchmarks/device/run.sh, docs/benchmarks.md "The GPU plan"): every
# stage runs here at tiny sizes on this build, so the script cannot rot between GPU sessions.
# Checks: --plan lists the stages with budgets summing to at most the plan's total; each stage
# writes its result file with a verdict, every verdict ok; the numbers each stage exists to report
# are in its file (tokens/s against the reference, packed against unpacked, offload, the long
# lengths, the DFlash draft against EAGLE3, Muon against AdamW); a stage over its budget is cut and the next ones still run and report.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
W="$BUILD/e2e_work/device_plan"; rm -rf "$W"; mkdir -p "$W"
RUN="$SRC/benchmarks/device/run.sh"

plan="$(bash "$RUN" --plan)" || fail "--plan"
for s in setup cuda-tests fixed-length packing offload longctx dflash muon; do
  grep -q " $s " <<<"$plan" || { echo "$plan"; fail "--plan lacks stage $s"; }
done
total=$(awk '$3 ~ /s$/ && $1 ~ /^[0-9]+$/ { sub(/s$/, "", $3); t += $3 } END { print t }' <<<"$plan")
[ "$total" -le 480 ] || fail "the stages' budgets add up to $total s, over the plan's 480"

dry() {  # OUT DIR, then environment assignments
  local out="$1"; shift
  env DEVICE=cpu FSDP_DEVICE_BIN="$BUILD" FSDP_PYTHON="$PY" OUT="$out" "$@" bash "$RUN" >"$out.log" 2>&1
}
dry "$W/out" || { tail -30 "$W/out.log"; fail "dry run exit code"; }
n=0
for f in "$W"/out/0[0-7]-*.txt; do
  n=$((n + 1))
  v="$(tail -n 1 "$f")"
  [[ "$v" == "verdict: ok"* ]] || { cat "$f"; fail "$(basename "$f"): $v"; }
done
[ "$n" -eq 8 ] || fail "$n stage files, expected 8"
grep -q "ratio fsdp-train / reference: tokens/s" "$W/out/02-fixed-length.txt" || { cat "$W/out/02-fixed-length.txt"; fail "no ratio against the reference"; }
grep -q "packed / unpacked" "$W/out/03-packing.txt" || fail "no packing ratio"
grep -q "cpu offload:" "$W/out/04-offload.txt" || fail "no offload numbers"
grep -q "S = 256: peak device memory" "$W/out/05-longctx.txt" || fail "no long-context numbers"
grep -q "dflash / eagle3" "$W/out/06-dflash.txt" || { cat "$W/out/06-dflash.txt"; fail "no DFlash numbers"; }
grep -q "optimizer step ms, muon/adamw" "$W/out/07-muon.txt" || { cat "$W/out/07-muon.txt"; fail "no Muon numbers"; }
[ -s "$W/out/metrics.tar.gz" ] && [ -s "$W/out/runs.log" ] || fail "metrics.tar.gz or runs.log missing"

# A stage over its budget is cut (its file says so) and the next stage still runs and reports.
dry "$W/cut" FSDP_DEVICE_SKIP="cuda-tests packing offload dflash muon" FSDP_DEVICE_BUDGETS="fixed-length=2" ||
  { tail -20 "$W/cut.log"; fail "cut dry run exit code"; }
grep -q "verdict: cut at its 2 s budget" "$W/cut/02-fixed-length.txt" || { cat "$W/cut/02-fixed-length.txt"; fail "fixed-length not cut at 2 s"; }
grep -q "verdict: skipped" "$W/cut/03-packing.txt" || fail "FSDP_DEVICE_SKIP not honoured"
grep -q "verdict: ok" "$W/cut/05-longctx.txt" || { cat "$W/cut/05-longctx.txt"; fail "the stage after a cut one did not run"; }
# A plan too short for anything: every stage says it was not run, and every file is written.
dry "$W/short" FSDP_DEVICE_TOTAL=3 || { tail -20 "$W/short.log"; fail "short dry run exit code"; }
[ "$(grep -l "verdict: not run" "$W"/short/0[0-7]-*.txt | wc -l)" -eq 8 ] || fail "not every stage of a spent plan says not run"
echo PASS
