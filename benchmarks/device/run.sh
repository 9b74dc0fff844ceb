#!/usr/bin/env bash
# The GPU plan: every GPU measurement of fsdp-train as one priority-ordered script that fits one
# device call (one H200 on a bare machine; the plan's stages add up to FSDP_DEVICE_TOTAL, 480 s by
# default, of the 600 a call may take). Stages run in order, each under its own time budget (cut at
# what is left of the total), each writing its result file $OUT/NN-<stage>.txt as it runs and a last
# line "verdict: ..." when it ends, so a run cut off anywhere still returns every earlier stage; a
# failed stage never stops the later ones.
#   bash benchmarks/device/run.sh --plan   the stages, their budgets and what each measures
#   bash benchmarks/device/run.sh          the plan (device tool: carry [".deb", ".gpubin"], timeout_s 560)
#   DEVICE=cpu bash benchmarks/device/run.sh   the CPU dry run: every stage at tiny sizes on this
#                                              machine's build (tests/e2e/device_plan.sh, in the suite)
# Before a GPU call, here: bash benchmarks/device/fetch_debs.sh && bash benchmarks/device/prebuild.sh
# (Open MPI and the other Debian libraries the machine lacks, and the executables built against the
# same torch 2.11.0+cu130 for sm_90; without .gpubin the setup stage builds on the machine, which
# costs minutes of device time). Environment: FSDP_DEVICE_SKIP="stage ..." leaves stages out;
# FSDP_DEVICE_BUDGETS="stage=seconds ..." overrides budgets; FSDP_DEVICE_TOTAL, FSDP_DEVICE_STEPS,
# FSDP_DEVICE_SEQ resize; FSDP_DEVICE_BIN=<build dir> uses
# that build (the dry run); OUT is where the result files go (default out/device).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export REPO

# name:budget_s:what it measures, in priority order.
STAGES=(
  "setup:30:Debian libraries, the prebuilt executables (or a build), the machine"
  "cuda-tests:70:[cuda] tests (fused kernels at draft vocabularies 32000/151936/262144, engine on CUDA), the NCCL backend at 1 rank, mpi_comm at 2 ranks sharing the GPU"
  "fixed-length:130:llama3-8B-eagle3 draft, S=2048, bf16: fsdp-train with and without --fused-cuda-kernels against the PyTorch FSDP2 reference (tokens/s, MFU, peak memory, time breakdown)"
  "packing:80:chat-length samples, global batch 16: --packing against unpacked and the fixed-length run"
  "offload:50:--cpu-offload: tokens/s, peak GPU memory and host RSS"
  "longctx:70:one step per length (16k, 32k, 64k): peak GPU memory against fsdp-train memory-plan"
  "dflash:30:a 1-layer DFlash draft (block 16, 512 anchors) on the fixed-length features: tokens/s and peak memory against the EAGLE3 run"
  "muon:20:--optimizer muon on the llama3-8B-eagle3 draft: the optimizer step's ms, tokens/s and peak memory against the AdamW fixed-length run"
)
if [ "${1:-}" = --plan ]; then
  total=0
  printf '%-3s %-13s %7s  %s\n' "#" stage budget "what it measures"
  i=0
  for s in "${STAGES[@]}"; do
    IFS=: read -r name budget what <<<"$s"
    printf '%-3s %-13s %6ss  %s\n' "$i" "$name" "$budget" "$what"
    total=$((total + budget)); i=$((i + 1))
  done
  echo "total ${total} s (FSDP_DEVICE_TOTAL=${FSDP_DEVICE_TOTAL:-480}: a stage is cut at what is left of it)"
  exit 0
fi

DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-$REPO/out/device}"
mkdir -p "$OUT"
export DEVICE OUT
exec > >(tee "$OUT/device.log") 2>&1
T0=$(date +%s)
DEADLINE=$((T0 + ${FSDP_DEVICE_TOTAL:-480}))
M=/tmp/fsdp-device-metrics   # every run's metrics.jsonl, bundled into $OUT/metrics.tar.gz
rm -rf "$M"; mkdir -p "$M"
: >"$OUT/runs.log"
export M T0
stamp() { echo "[device +$(( $(date +%s) - T0 ))s] $*"; }
bundle() { tar czf "$OUT/metrics.tar.gz" -C "$M" . 2>/dev/null; }
# lim N: N seconds or what is left of the current stage, whichever is less (at least 1).
lim() { local l=$((STAGE_END - $(date +%s))); [ "$l" -lt "$1" ] || l="$1"; [ "$l" -ge 1 ] || l=1; echo "$l"; }
export -f stamp bundle lim

PY="${FSDP_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PY
# Sizes: the GPU's, or the dry run's tiny ones (the toy draft gen-toy-data writes).
if [ "$DEVICE" = cpu ]; then
  SEQ="${FSDP_DEVICE_SEQ:-64}" STEPS="${FSDP_DEVICE_STEPS:-4}" LOG=1 SAMPLES=8 PSTEPS=2 OSTEPS=3
  BLOCK=4 ANCHORS=8
  SIZES="--hidden-size 64 --vocab-size 512 --draft-vocab-size 256" DRAFT="" REF_WORKERS=1
  LONG="${FSDP_DEVICE_LONG_LENGTHS:-128 256}" PRECISION=fp32 LOOP_THREADS="--threads 1"
else
  SEQ="${FSDP_DEVICE_SEQ:-2048}" STEPS="${FSDP_DEVICE_STEPS:-30}" LOG=5 SAMPLES=34 PSTEPS=10 OSTEPS=10
  BLOCK=16 ANCHORS=512
  SIZES="--hidden-size 4096 --vocab-size 128256 --draft-vocab-size 32000" REF_WORKERS=4
  DRAFT="$REPO/configs/models/llama3-8B-eagle3.json"
  LONG="${FSDP_DEVICE_LONG_LENGTHS:-16384 32768 65536}" PRECISION=bf16 LOOP_THREADS=""
fi
export SEQ STEPS LOG SAMPLES PSTEPS OSTEPS DRAFT LONG PRECISION SIZES LOOP_THREADS REF_WORKERS BLOCK ANCHORS

# ---- stage functions (each runs in its own shell under its budget; B is the build directory) ----

stage_setup() {
  stamp "host: $(hostname), $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
  timeout 60 "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  if [ -n "${FSDP_DEVICE_BIN:-}" ]; then
    echo "build: $FSDP_DEVICE_BIN (FSDP_DEVICE_BIN)"
  elif [ -x "$REPO/.gpubin/fsdp-train" ] && [ -x "$REPO/.gpubin/fsdp-train-core" ]; then
    if ldd "$REPO/.gpubin/fsdp-train-core" "$REPO"/.gpubin/tests/* | grep "not found"; then
      echo "prebuilt executables: libraries missing (above)"; return 1
    fi
    "$REPO/.gpubin/fsdp-train" --version || { echo "prebuilt fsdp-train --version failed"; return 1; }
  else
    build_here || return 1
  fi
  "$(bin_dir)/fsdp-train" --version | sed -n 1,3p
}

# The machine's own build, when no executables were carried (minutes of device time).
build_here() {
  stamp "no .gpubin: configure and build here (build.log)"
  timeout "$(lim 3000)" bash "$REPO/benchmarks/device/build.sh" "$PY" "$REPO/build-gpu" \
    >"$OUT/build.log" 2>&1 || { grep -m 30 -E "error|FAILED" "$OUT/build.log"; return 1; }
}

bin_dir() {
  if [ -n "${FSDP_DEVICE_BIN:-}" ]; then echo "$FSDP_DEVICE_BIN"
  elif [ -x "$REPO/.gpubin/fsdp-train" ]; then echo "$REPO/.gpubin"
  else echo "$REPO/build-gpu"; fi
}
# The executable of a test: .gpubin/tests/<name> or <build>/tests/<name>.
test_exe() { echo "$(bin_dir)/tests/$1"; }

stage_cuda_tests() {
  local rc=0 t exe out
  # Exit code 0 with every case run is a pass; the Catch2 totals line says how many ran.
  for t in "unit_model:[cuda]" "unit_shard:[cuda]"; do
    exe="$(test_exe "${t%%:*}")"
    [ -x "$exe" ] || { echo "missing $exe"; rc=1; continue; }
    stamp "${t%%:*} ${t#*:}"
    timeout "$(lim 60)" "$exe" "${t#*:}" >"/tmp/fsdp-device-$$.log" 2>&1 ||
      { echo "${t%%:*} ${t#*:}: exit $?"; rc=1; grep -B 3 -A 12 "FAILED:" "/tmp/fsdp-device-$$.log" | sed -n 1,150p; }
    grep -E "skipped: no GPU|FAILED|passed|failed" "/tmp/fsdp-device-$$.log" | tail -12
  done
  exe="$(test_exe mpi_comm)"
  # The NCCL backend at one rank; then mpi_comm at two ranks sharing the one GPU: the MPI backend's
  # collectives (CPU tensors; it refuses CUDA tensors by name) and what NCCL does with two ranks on
  # one device (it refuses a duplicate GPU), recorded as it happens.
  stamp "mpi_comm [nccl], 1 rank"
  timeout "$(lim 45)" "$exe" "[nccl]" --order decl >"/tmp/fsdp-device-$$.log" 2>&1 ||
    { echo "mpi_comm [nccl] 1 rank: exit $?"; rc=1; }
  grep -E "skipped: no GPU|FAILED|passed|failed" "/tmp/fsdp-device-$$.log" | tail -8
  stamp "mpi_comm [cuda]~[nccl], 2 ranks on one GPU (the MPI backend and CUDA tensors)"
  timeout "$(lim 45)" "$MPIRUN" --allow-run-as-root -n 2 "$exe" "[cuda]~[nccl]" --order decl >"/tmp/fsdp-device-$$.log" 2>&1 ||
    { echo "mpi_comm [cuda]~[nccl] 2 ranks: exit $?"; rc=1; }
  grep -E "skipped: no GPU|FAILED|passed|failed" "/tmp/fsdp-device-$$.log" | tail -8
  if [ "$DEVICE" = cuda ]; then
    # fsdp-train itself with more ranks than GPUs: a usage error naming both, before NCCL.
    local data
    data="$(gen tiny --num-samples 4 --min-len 32 --max-len 32)" && {
      stamp "fsdp-train --device cuda at 2 ranks on one GPU (expected: exit 2 naming the GPU count)"
      out="$(timeout "$(lim 40)" "$MPIRUN" --allow-run-as-root -n 2 "$(bin_dir)/fsdp-train" \
        --target-model-path "$data/target" --draft-model-config "$data/draft_config.json" \
        --train-hidden-states-path "$data/hidden_states" --output-dir /tmp/fsdp-device-twoonone \
        --max-length 32 --total-steps 1 --device cuda --report-to none 2>&1)"
      echo "exit $? (want 2): $(grep -m 1 -o "NCCL needs one GPU per rank" <<<"$out" || tail -3 <<<"$out")"
    }
  fi
  stamp "mpi_comm [nccl], 2 ranks on one GPU (recorded: NCCL refuses two ranks on one device)"
  out="$(timeout "$(lim 30)" "$MPIRUN" --allow-run-as-root -n 2 "$exe" "[nccl]" --order decl 2>&1)"
  echo "mpi_comm [nccl] 2 ranks on one GPU: exit $?"
  grep -E "Duplicate GPU|invalid usage|ncclInvalidUsage|HINT|passed|failed" <<<"$out" | sort | uniq -c | sed -n 1,8p
  return $rc
}

# gen NAME ARGS: synthetic features (hidden 4096, vocab 128256, draft vocab 32000 on the GPU) once.
gen() {
  local dir="/tmp/fsdp-device-data-$1"; shift
  if [ ! -f "$dir/toy_data.json" ]; then
    rm -rf "$dir"
    timeout "$(lim 120)" "$(bin_dir)/fsdp-train" gen-toy-data --out "$dir" $SIZES "$@" \
      >>"$OUT/runs.log" 2>&1 || { echo "gen-toy-data $*: failed"; rm -rf "$dir"; return 1; }
  fi
  echo "$dir"
}
export -f gen bin_dir test_exe build_here

# keep_run NAME RC: a run's log into runs.log and its metrics into the bundle; returns RC.
keep_run() {
  local name="$1" rc="$2"
  { echo "===== $name (exit code $rc)"; cat "/tmp/fsdp-device-$name.log"; } >>"$OUT/runs.log"
  cp "/tmp/fsdp-device-$name/metrics.jsonl" "$M/$name-metrics.jsonl" 2>/dev/null
  bundle
  [ "$rc" -eq 0 ] || { echo "$name: exit code $rc (124: time limit)"; tail -12 "/tmp/fsdp-device-$name.log"; }
  return "$rc"
}

# fsdp_run NAME LIMIT DATA GLOBAL_BATCH STEPS FLAGS...: one fsdp-train run, its metrics kept.
fsdp_run() {
  local name="$1" limit="$2" data="$3" gb="$4" steps="$5" draft
  shift 5
  draft="${DRAFT:-$data/draft_config.json}"
  rm -rf "/tmp/fsdp-device-$name"
  timeout "$(lim "$limit")" "$(bin_dir)/fsdp-train" --target-model-path "$data/target" \
    --draft-model-config "$draft" --train-hidden-states-path "$data/hidden_states" \
    --cache-dir "$data/cache" --output-dir "/tmp/fsdp-device-$name" --max-length "$SEQ" \
    --draft-global-batch-size "$gb" --draft-micro-batch-size 1 --num-epochs 4 \
    --total-steps "$steps" --log-steps "$LOG" --save-interval 0 --save-final false \
    --report-to none --device "$DEVICE" --mixed-precision "$PRECISION" $LOOP_THREADS "$@" \
    >"/tmp/fsdp-device-$name.log" 2>&1
  keep_run "$name" $?
}

# ref_run NAME LIMIT DATA GLOBAL_BATCH STEPS: the PyTorch FSDP2 reference (benchmarks/reference).
ref_run() {
  local name="$1" limit="$2" data="$3" gb="$4" steps="$5"
  rm -rf "/tmp/fsdp-device-$name"
  timeout "$(lim "$limit")" "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    "$REPO/benchmarks/reference/train.py" --device "$DEVICE" --target-model-path "$data/target" \
    --draft-model-config "${DRAFT:-$data/draft_config.json}" \
    --train-hidden-states-path "$data/hidden_states" --cache-dir "$data/cache-ref" \
    --output-dir "/tmp/fsdp-device-$name" --max-length "$SEQ" --draft-global-batch-size "$gb" \
    --draft-micro-batch-size 1 --num-epochs 4 --total-steps "$steps" --log-steps "$LOG" \
    --param-dtype "$PRECISION" --loader-workers "$REF_WORKERS" >"/tmp/fsdp-device-$name.log" 2>&1
  keep_run "$name" $?
}
export -f keep_run fsdp_run ref_run

stage_fixed_length() {
  local data rc=0
  stamp "synthetic features: $SAMPLES samples of $SEQ tokens"
  data="$(gen "fixed-$SEQ" --num-samples "$SAMPLES" --min-len "$SEQ" --max-len "$SEQ" --samples-per-dir 64)" || return 1
  stamp "fsdp-train: $STEPS steps (2 profiled in the first, warm-up window)"
  fsdp_run plain 70 "$data" 1 "$STEPS" --profile --profile-start-step 3 --profile-num-steps 2 \
    --profile-dir /tmp/fsdp-device-profile || rc=1
  [ -f /tmp/fsdp-device-profile/rank0.summary.txt ] &&
    grep -A 14 "GPU kernels" /tmp/fsdp-device-profile/rank0.summary.txt | cut -c1-150
  if [ "$DEVICE" = cuda ]; then
    stamp "fsdp-train --fused-cuda-kernels: $STEPS steps"
    fsdp_run fused 60 "$data" 1 "$STEPS" --fused-cuda-kernels true || rc=1
  else
    echo "fused: --fused-cuda-kernels needs a GPU (refused on a CPU run): not run in the dry run"
  fi
  stamp "reference (PyTorch FSDP2): $STEPS steps"
  ref_run reference 90 "$data" 1 "$STEPS" || rc=1
  for run in plain fused; do
    [ -s "$M/$run-metrics.jsonl" ] || continue
    echo "--- $run against the reference"
    "$PY" "$REPO/benchmarks/device/compare.py" "$M/$run-metrics.jsonl" "$M/reference-metrics.jsonl" \
      "${DRAFT:-$data/draft_config.json}" "$SEQ"
  done
  "$PY" "$REPO/benchmarks/device/summary.py" fused "$M/fused-metrics.jsonl" "$M/plain-metrics.jsonl"
  "$PY" "$REPO/benchmarks/device/summary.py" breakdown "$M/plain-metrics.jsonl"
  return $rc
}

stage_packing() {
  local lengths data rc=0
  lengths=$(grep -v '^#' "$REPO/benchmarks/device/chat_lengths.txt" | "$PY" -c '
import sys; seq = int(sys.argv[1]); ls = [int(x) for x in sys.stdin.read().split(",")]
print(",".join(str(max(2, round(l * seq / max(ls)))) for l in ls))' "$SEQ")
  stamp "synthetic features with the chat lengths (longest $SEQ)"
  data="$(gen "chat-$SEQ" --num-samples 48 --lengths "$lengths" --samples-per-dir 48)" || return 1
  stamp "global batch 16, $PSTEPS steps: unpacked, then --packing"
  fsdp_run chat-unpacked 40 "$data" 16 "$PSTEPS" || rc=1
  fsdp_run chat-packed 40 "$data" 16 "$PSTEPS" --packing || rc=1
  "$PY" "$REPO/benchmarks/device/summary.py" packing "$M/plain-metrics.jsonl" \
    "$M/chat-unpacked-metrics.jsonl" "$M/chat-packed-metrics.jsonl"
  return $rc
}

stage_offload() {
  local data
  data="$(gen "fixed-$SEQ" --num-samples "$SAMPLES" --min-len "$SEQ" --max-len "$SEQ" --samples-per-dir 64)" || return 1
  stamp "fsdp-train --cpu-offload: $OSTEPS steps"
  fsdp_run offload 60 "$data" 1 "$OSTEPS" --cpu-offload || return 1
  "$PY" "$REPO/benchmarks/device/summary.py" offload "$M/offload-metrics.jsonl" "$M/plain-metrics.jsonl"
}

stage_dflash() {
  local data dd="/tmp/fsdp-device-data-dflash-$SEQ"
  data="$(gen "fixed-$SEQ" --num-samples "$SAMPLES" --min-len "$SEQ" --max-len "$SEQ" --samples-per-dir 64)" || return 1
  if [ ! -f "$dd/draft_config.json" ]; then
    stamp "DFlash features from the fixed-length ones (3 layers as target layers 1, 3, 5)"
    rm -rf "$dd"
    timeout "$(lim 60)" "$PY" "$REPO/benchmarks/data/dflash_features.py" "$data" "$dd" --layers 1 \
      --block-size "$BLOCK" || { echo "dflash_features.py: failed"; rm -rf "$dd"; return 1; }
  fi
  stamp "fsdp-train, DFlash draft: $STEPS steps"
  DRAFT="$dd/draft_config.json" fsdp_run dflash 60 "$dd" 1 "$STEPS" --num-anchors "$ANCHORS" || return 1
  "$PY" "$REPO/benchmarks/device/summary.py" dflash "$M/dflash-metrics.jsonl" "$M/plain-metrics.jsonl"
}

stage_muon() {
  local data
  data="$(gen "fixed-$SEQ" --num-samples "$SAMPLES" --min-len "$SEQ" --max-len "$SEQ" --samples-per-dir 64)" || return 1
  stamp "fsdp-train --optimizer muon: $OSTEPS steps"
  fsdp_run muon 20 "$data" 1 "$OSTEPS" --optimizer muon || return 1
  "$PY" "$REPO/benchmarks/device/summary.py" muon "$M/muon-metrics.jsonl" "$M/plain-metrics.jsonl"
}

stage_longctx() {
  local L data rc=0
  for L in $LONG; do
    stamp "S = $L: 2 samples, one step"
    data="$(gen "long-$L" --num-samples 2 --min-len "$L" --max-len "$L" --samples-per-dir 2)" || { rc=1; continue; }
    SEQ="$L" LOG=1 fsdp_run "long-$L" 40 "$data" 1 1 || { rc=1; continue; }
    "$(bin_dir)/fsdp-train" memory-plan --draft-model-config "${DRAFT:-$data/draft_config.json}" \
      --max-length "$L" --sp-sizes 1 --overhead-gib 0.8 | grep -E "^\| $L " |
      awk -F'|' '{ print "memory-plan estimate: " $3 " GiB" }'
    "$PY" "$REPO/benchmarks/device/summary.py" longctx "$M/long-$L-metrics.jsonl" "$L"
  done
  return $rc
}
export -f stage_setup stage_cuda_tests stage_fixed_length stage_packing stage_offload stage_longctx stage_dflash stage_muon

# ---- the Debian libraries the machine lacks (carried as .deb, unpacked here) ----
if [ -d "$REPO/.deb" ] && [ "$DEVICE" != cpu ]; then
  DEBROOT=/tmp/fsdp-deb
  rm -rf "$DEBROOT"; mkdir -p "$DEBROOT"
  for f in "$REPO"/.deb/*.deb; do dpkg -x "$f" "$DEBROOT"; done
  export PATH="$DEBROOT/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$DEBROOT/usr/lib/x86_64-linux-gnu:$DEBROOT/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
  export OPAL_PREFIX="$DEBROOT/usr" OPAL_LIBDIR="$DEBROOT/usr/lib/x86_64-linux-gnu/openmpi/lib"
  export OPAL_SYSCONFDIR="$DEBROOT/etc/openmpi"   # Debian's MCA defaults (/etc/openmpi is absolute)
  export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1
  export DEB_PREFIXES="$DEBROOT/usr;$DEBROOT/usr/lib/x86_64-linux-gnu/cmake;$DEBROOT/usr/share/cmake;$DEBROOT/usr/lib/cmake"
  export DEB_CMAKE="-DMPI_CXX_COMPILER=$DEBROOT/usr/bin/mpicxx.openmpi -DMPIEXEC_EXECUTABLE=$DEBROOT/usr/bin/mpirun.openmpi -DCMAKE_CXX_FLAGS=-isystem$DEBROOT/usr/include"
fi
# Debian's mpirun is a symlink through /etc/alternatives, which dpkg -x does not make: the real one.
MPIRUN="$(command -v mpirun.openmpi || command -v mpirun || echo mpirun)"
export MPIRUN OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The prebuilt executables name /work/main in their library path (prebuild.sh builds there), and
# find LibTorch, NCCL and the CUDA runtime in the machine's torch wheel.
if [ -x "$REPO/.gpubin/fsdp-train" ] && [ -z "${FSDP_DEVICE_BIN:-}" ]; then
  [ -e /work/main ] || { mkdir -p /work && ln -s "$REPO" /work/main; }
  TORCH_DIR="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)"
  SITE="$(dirname "$TORCH_DIR")"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$TORCH_DIR/lib:$SITE/nvidia/nccl/lib:$SITE/nvidia/cu13/lib"
fi

# ---- the plan ----
skip() { [[ " ${FSDP_DEVICE_SKIP:-} " == *" $1 "* ]]; }
i=0
for s in "${STAGES[@]}"; do
  IFS=: read -r name budget what <<<"$s"
  f="$OUT/$(printf '%02d' "$i")-$name.txt"
  i=$((i + 1))
  for o in ${FSDP_DEVICE_BUDGETS:-}; do [ "${o%%=*}" = "$name" ] && budget="${o#*=}"; done
  now=$(date +%s)
  left=$((DEADLINE - now))
  [ "$left" -lt "$budget" ] && budget=$left
  if skip "$name"; then
    echo "verdict: skipped (FSDP_DEVICE_SKIP)" >"$f"; continue
  fi
  if [ "$left" -lt 5 ]; then
    echo "verdict: not run (the plan's $((${FSDP_DEVICE_TOTAL:-480})) s were spent)" >"$f"; continue
  fi
  if [ "$name" != setup ] && [ "${SETUP_FAILED:-0}" = 1 ]; then
    echo "verdict: not run (setup failed: 00-setup.txt)" >"$f"; continue
  fi
  export STAGE_END=$((now + budget))
  stamp "stage $name (budget ${budget} s): $what"
  { echo "stage $name, budget ${budget} s: $what"; echo "device $DEVICE, commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"; } >"$f"
  timeout --kill-after=5 "$budget" bash -c "stage_${name//-/_}" >>"$f" 2>&1
  rc=$?
  # A command inside the stage is limited to what is left of it (lim), so a stage that reaches its
  # end may be stopped by that inner limit just before the outer one: that too is a cut.
  [ $rc -ne 0 ] && [ "$(date +%s)" -ge "$STAGE_END" ] && rc=124
  case $rc in
    0) v="ok" ;;
    124|137) v="cut at its ${budget} s budget" ;;
    *) v="failed (exit $rc)" ;;
  esac
  [ "$name" = setup ] && [ $rc -ne 0 ] && SETUP_FAILED=1
  echo "verdict: $v ($(( $(date +%s) - now )) s)" >>"$f"
  cat "$f"
done
bundle
stamp "done"
