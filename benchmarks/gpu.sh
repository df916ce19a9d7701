#!/usr/bin/env bash
# Every accelerator check on a GPU, in one go, within 8 minutes:
#   bash benchmarks/gpu.sh            (from the repository root, .venv or any env with JAX[cuda])
# 1. the kernel table against cuDNN: bfloat16 causal fwd+bwd, no bias and
#    ALiBi, 'cudnn' vs our Pallas kernel ('pallas_gpu') vs 'chunked';
# 2. our kernel against 'chunked' and 'dense' in float32, with every bias it
#    builds in the kernel (ALiBi, forgetting gates, Hard-ALiBi windows);
# 3. the attention layer (lesson 7.3) bfloat16 fwd+bwd: cuDNN vs ours vs
#    PyTorch SDPA when a CUDA PyTorch is installed;
# 4. memory: ALiBi at T = 65,536 forward and backward on our kernel;
# 5. the paper preset's 10 seeds in one program (memory, FLOPs, step time);
# 6. the tiny study (correctness on the GPU).
# Each step has its own time limit; a failed step is reported and the rest
# still run. Results land in benchmarks/results/gpu/; copy the tables into
# the README with the date and the device (device.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
backend=$($PY -c 'import jax; print(jax.default_backend())' 2>/dev/null)
if [ "$backend" != gpu ]; then
  echo "benchmarks/gpu.sh needs a GPU; JAX's default backend here is '$backend'." >&2
  exit 2
fi
(nvidia-smi -L || true) | tee "$OUT/device.txt"
{ date -u +%FT%TZ; $PY -c 'import jax; print("jax", jax.__version__)'; } >> "$OUT/device.txt"
if $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  TORCH=--pytorch
else
  echo "no CUDA PyTorch: the layer table times ours only" | tee -a "$OUT/device.txt"
  TORCH=--nopytorch
fi
failed=()
step() {  # step NAME SECONDS COMMAND...: run with a limit, log, carry on
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - start)) s" | tee -a "$OUT/device.txt"
  [ $rc -eq 0 ] || failed+=("$name")
}
step kernels_bf16 90 $PY -m benchmarks.kernels --impls=cudnn,pallas_gpu,chunked \
  --specs=none,alibi --lengths=1024,4096,16384 --dtype=bfloat16 --repeats=5 \
  --out="$OUT/kernels_bf16"
step kernels_f32 60 $PY -m benchmarks.kernels --impls=pallas_gpu,chunked,dense \
  --specs=none,alibi,difference,windows --lengths=1024,4096 --repeats=3 \
  --out="$OUT/kernels_f32"
step layer_bf16 90 $PY -m benchmarks.attention --dtype=bfloat16 \
  --impls=cudnn,pallas_gpu,chunked --lengths=1024,4096,16384 --dense_max_length=0 \
  --repeats=5 $TORCH --out="$OUT/layer_bf16"
step alibi_65536 60 $PY -m benchmarks.kernels --impls=pallas_gpu,chunked --specs=alibi \
  --lengths=65536 --batch=1 --heads=8 --dtype=bfloat16 --repeats=2 --out="$OUT/alibi_65536"
step seeds 120 $PY -m benchmarks.seeds --seeds=1,3,10 --steps=200 --repeats=3 --nopytorch \
  --paper --out="$OUT/seeds"
step tiny_study 60 $PY -m experiments.length_extrapolation \
  --config=configs/copy.py:scale=tiny --workdir="$OUT/tiny_study"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]} (logs in $OUT)" >&2
  exit 1
fi
echo "done: $OUT"
