#!/usr/bin/env bash
# THE script for the GPU machine (one H200; torch 2.11.0+cu130 in /opt/torch/.venv; CUDA 13.0;
# CMake + ninja; no internet, no apt). Call it through the device tool from the repo root with
# carry [".deb"] (made by benchmarks/device/fetch_debs.sh here), e.g.
#   bash benchmarks/device/run.sh          (budget: well inside 10 minutes)
# It: 1) uses the machine's MPI or unpacks the carried Debian packages, 2) builds fsdp-train
# against the machine's torch, 3) runs the [cuda]/[nccl] tests, 4) benchmarks one training
# step loop of the llama3-8B-eagle3 draft at sequence length 2048 on synthetic features for
# fsdp-train and for the PyTorch FSDP2 reference on the same GPU, and prints tokens/s, MFU and
# peak memory for both and their ratio. Everything is logged to $OUT/device.log.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$REPO/out/device}"
mkdir -p "$OUT"
exec > >(tee "$OUT/device.log") 2>&1
STEPS="${FSDP_DEVICE_STEPS:-12}"
SEQ="${FSDP_DEVICE_SEQ:-2048}"
T0=$(date +%s)
stamp() { echo "[device +$(( $(date +%s) - T0 ))s] $*"; }
PY="${FSDP_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
stamp "host: $(hostname), $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null)"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'

# 1. MPI and the other Debian dependencies.
DEBROOT="$REPO/.deb/root"
PREFIXES=""
EXTRA_CMAKE=()
if command -v mpicxx >/dev/null && [ -f /usr/include/yaml-cpp/yaml.h ] && [ -f /usr/include/CLI/CLI.hpp ]; then
  stamp "using the machine's MPI and libraries"
else
  [ -d "$REPO/.deb" ] || { echo "no MPI here and no carried .deb folder: run benchmarks/device/fetch_debs.sh and carry .deb"; exit 1; }
  stamp "unpacking $(ls "$REPO"/.deb/*.deb | wc -l) carried Debian packages into $DEBROOT"
  rm -rf "$DEBROOT"; mkdir -p "$DEBROOT"
  for f in "$REPO"/.deb/*.deb; do dpkg -x "$f" "$DEBROOT"; done
  export PATH="$DEBROOT/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$DEBROOT/usr/lib/x86_64-linux-gnu:$DEBROOT/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
  export OPAL_PREFIX="$DEBROOT/usr"          # relocates Open MPI's wrappers and help files
  export OPAL_LIBDIR="$DEBROOT/usr/lib/x86_64-linux-gnu/openmpi/lib"
  # Debian's mpicxx is a symlink chain through /etc/alternatives: point at the real wrapper.
  MPICXX="$DEBROOT/usr/bin/mpicxx.openmpi"
  PREFIXES="$DEBROOT/usr;$DEBROOT/usr/lib/x86_64-linux-gnu/cmake;$DEBROOT/usr/share/cmake;$DEBROOT/usr/lib/cmake"
  EXTRA_CMAKE=(-DMPI_CXX_COMPILER="$MPICXX" -DMPIEXEC_EXECUTABLE="$DEBROOT/usr/bin/mpirun.openmpi"
    -DCMAKE_CXX_FLAGS="-isystem $DEBROOT/usr/include")
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# 2. Build against the machine's torch. Warnings do not stop this one-shot build (another
# compiler version may warn where Debian's GCC 12 does not); they stay in build.log.
TORCH_PREFIX="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
stamp "configure"
cmake -S "$REPO" -B "$REPO/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIXES" -DFSDP_PYTHON="$PY" -DFSDP_GPU=CUDA \
  -DTORCH_CUDA_ARCH_LIST=9.0 -DFSDP_WERROR=OFF "${EXTRA_CMAKE[@]}" >"$OUT/cmake.log" 2>&1 ||
  { tail -40 "$OUT/cmake.log"; exit 1; }
stamp "build"
ninja -C "$REPO/build-gpu" -j "$(nproc)" fsdp-train mpi_comm unit_model unit_shard \
  >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
B="$REPO/build-gpu"

# 3. GPU tests (they skip nothing here: a GPU is present).
stamp "GPU tests"
rc_tests=0
# Test executables live in build-gpu/tests/ (the same layout as build/tests/ here).
for t in "unit_model [cuda]" "unit_shard [cuda]" "mpi_comm [nccl]"; do
  exe="$B/tests/${t%% *}"
  [ -x "$exe" ] || { echo "missing test executable $exe"; rc_tests=1; continue; }
  "$exe" "${t#* }" || rc_tests=1
done
stamp "GPU tests: $([ $rc_tests -eq 0 ] && echo passed || echo FAILED)"

# 4. Synthetic llama3-8B features at S=$SEQ (hidden 4096, vocab 128256, draft vocab 32000).
DATA=/tmp/fsdp-device-data
stamp "generating synthetic features"
"$B/fsdp-train" gen-toy-data --out "$DATA" --num-samples 16 --min-len "$SEQ" --max-len "$SEQ" \
  --hidden-size 4096 --vocab-size 128256 --draft-vocab-size 32000 --samples-per-dir 16 \
  >"$OUT/gen.log" 2>&1 || { tail -20 "$OUT/gen.log"; exit 1; }
DRAFT="$REPO/configs/models/llama3-8B-eagle3.json"

stamp "fsdp-train: $STEPS steps, bf16, 1 GPU"
"$B/fsdp-train" --target-model-path "$DATA/target" --draft-model-config "$DRAFT" \
  --train-hidden-states-path "$DATA/hidden_states" --cache-dir "$DATA/cache" \
  --output-dir /tmp/fsdp-device-out --max-length "$SEQ" --draft-global-batch-size 1 \
  --draft-micro-batch-size 1 --num-epochs 1 --max-steps "$STEPS" --log-steps 4 \
  --save-interval 0 --report-to none --device cuda --mixed-precision bf16 \
  >"$OUT/fsdp-train.log" 2>&1 || { tail -40 "$OUT/fsdp-train.log"; exit 1; }
cp /tmp/fsdp-device-out/metrics.jsonl "$OUT/fsdp-train-metrics.jsonl" 2>/dev/null

stamp "reference (PyTorch FSDP2): $STEPS steps, bf16, 1 GPU"
"$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$REPO/benchmarks/reference/train.py" \
  --device cuda --target-model-path "$DATA/target" --draft-model-config "$DRAFT" \
  --train-hidden-states-path "$DATA/hidden_states" --cache-dir "$DATA/cache-ref" \
  --output-dir /tmp/fsdp-device-ref --max-length "$SEQ" --draft-global-batch-size 1 \
  --draft-micro-batch-size 1 --num-epochs 1 --total-steps "$STEPS" --param-dtype bf16 \
  >"$OUT/reference.log" 2>&1 || { tail -40 "$OUT/reference.log"; }
cp /tmp/fsdp-device-ref/metrics.jsonl "$OUT/reference-metrics.jsonl" 2>/dev/null

stamp "comparison"
"$PY" "$REPO/benchmarks/device/compare.py" "$OUT/fsdp-train-metrics.jsonl" \
  "$OUT/reference-metrics.jsonl" "$DRAFT" "$SEQ" | tee "$OUT/summary.txt"
stamp "done"
