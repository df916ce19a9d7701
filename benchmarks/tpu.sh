#!/usr/bin/env bash
# Every accelerator check on a TPU, in one go, within 8 minutes:
#   bash benchmarks/tpu.sh            (from the repository root, an env with JAX[tpu])
# 1. the kernel table against splash: bfloat16 causal fwd+bwd, no bias and
#    ALiBi, 'splash' vs our Pallas kernel ('pallas_tpu') vs 'tpu_flash' (a
#    dense bias) vs 'chunked';
# 2. our kernel against 'chunked' and 'dense' in float32, with every bias it
#    builds in the kernel (ALiBi, forgetting gates, Hard-ALiBi windows);
# 3. memory: ALiBi at T = 65,536 forward and backward on our kernel;
# 4. the paper preset's 10 seeds in one program;
# 5. the tiny study (correctness on the TPU).
# Each step has its own time limit; a failed step is reported and the rest
# still run. Results land in benchmarks/results/tpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-benchmarks/results/tpu}
mkdir -p "$OUT"
backend=$($PY -c 'import jax; print(jax.default_backend())' 2>/dev/null)
if [ "$backend" != tpu ]; then
  echo "benchmarks/tpu.sh needs a TPU; JAX's default backend here is '$backend'." >&2
  exit 2
fi
{ $PY -c 'import jax; print(jax.devices()); print("jax", jax.__version__)'; date -u +%FT%TZ; } \
  | tee "$OUT/device.txt"
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
step kernels_bf16 120 $PY -m benchmarks.kernels --impls=splash,pallas_tpu,tpu_flash,chunked \
  --specs=none,alibi --lengths=1024,4096,16384 --dtype=bfloat16 --dense_max_length=0 \
  --repeats=5 --out="$OUT/kernels_bf16"
step kernels_f32 90 $PY -m benchmarks.kernels --impls=pallas_tpu,chunked,dense \
  --specs=none,alibi,difference,windows --lengths=1024,4096 --repeats=3 \
  --out="$OUT/kernels_f32"
step alibi_65536 60 $PY -m benchmarks.kernels --impls=pallas_tpu,chunked --specs=alibi \
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
