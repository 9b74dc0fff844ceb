#!/usr/bin/env bash
# The start-up memory check through the binary (docs/troubleshooting.md "Memory estimate"): a run
# whose estimated memory cannot fit this host stops with exit 2 before reading any data or
# weights, naming the sizes, both figures and a HINT; the same run at a length that fits trains.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
DATA=$(toy_data fixed --num-samples 128 --min-len 32 --max-len 32 --samples-per-dir 32 --seed 1)
W="$BUILD/e2e_work/memory_check"; rm -rf "$W"; mkdir -p "$W"
ARGS="$(train_args "$DATA" "$W/out") --max-steps 1"

# The toy draft at the longest --max-length and 7 TTT steps with its head unchunked needs about
# 40 GiB of activations (24 GiB with the automatic chunked head).
expect_usage_error "over-sized run" "$BIN" $ARGS --max-length 1048576 --ttt-length 7 --head-chunk-rows -1
for marker in "--max-length 1048576" "--ttt-length 7" "GiB" "this host's memory"; do
  grep -qF -- "$marker" <<<"$out" || { tail -4 <<<"$out"; fail "memory error lacks '$marker'"; }
done
[ ! -e "$W/out/run_config.yaml" ] || fail "the refused run wrote run_config.yaml"
echo "ok: a run that cannot fit is refused at start-up with the numbers"

out="$("$BIN" $ARGS 2>&1)" || { tail -8 <<<"$out"; fail "the same run at --max-length 64 failed"; }
echo "ok: the same run at a length that fits trains"
