#!/usr/bin/env bash
# The benchmark suite on a GPU, in one go, within 8 minutes:
#   bash benchmarks/gpu.sh            (from the repository root, .venv or any env with JAX[cuda])
# bfloat16 causal layer fwd+bwd at T = 1024 … 16384: implementation='cudnn'
# (jax.nn's fused kernel) vs 'chunked' (ours, blockwise) vs PyTorch SDPA when
# a CUDA PyTorch is installed (else ours only, ratios to 'cudnn'); then the
# same float32 table for 'chunked' vs 'dense' at T = 1024, 4096, and one
# float32 study run on the GPU (tiny preset, for correctness), and the seeds
# benchmark with the paper preset's 10 seeds. Results land in
# benchmarks/results/gpu/; copy the tables into the README with the date and
# the device (`nvidia-smi -L`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
backend=$($PY -c 'import jax; print(jax.default_backend())')
if [ "$backend" != gpu ]; then
  echo "benchmarks/gpu.sh needs a GPU; JAX's default backend here is '$backend'." >&2
  exit 2
fi
(nvidia-smi -L || true) | tee "$OUT/device.txt"
date -u +%FT%TZ >> "$OUT/device.txt"
if $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  TORCH=--pytorch
else
  echo "no CUDA PyTorch: timing ours only" | tee -a "$OUT/device.txt"
  TORCH=--nopytorch
fi
timeout 150 $PY -m benchmarks.attention --dtype=bfloat16 --impls=cudnn,chunked \
  --lengths=1024,4096,16384 --dense_max_length=0 --repeats=5 $TORCH --out="$OUT/bf16"
timeout 60 $PY -m benchmarks.attention --dtype=float32 --impls=chunked,dense \
  --lengths=1024,4096 --repeats=3 $TORCH --out="$OUT/f32"
# Seeds in one program: the default model with 1/3/10 seeds, and the paper
# preset's 10 seeds stacked (memory, FLOPs, step time) — issue 15's estimate.
timeout 150 $PY -m benchmarks.seeds --seeds=1,3,10 --steps=200 --repeats=3 --nopytorch \
  --paper --out="$OUT/seeds"
timeout 60 $PY -m experiments.train --config=configs/copy.py:size=tiny --workdir="$OUT/tiny_run" \
  > "$OUT/tiny_run.txt"
echo "done: $OUT"
