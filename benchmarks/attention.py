r"""Causal attention layer forward+backward: ours vs PyTorch SDPA, side by side.

  pip install -r requirements-bench.txt
  python -m benchmarks.attention [--lengths=128,512,1024,2048,4096] [--out=benchmarks/results]

The layer is lesson 7.3's: W_Q, W_K, W_V, W_O (no biases), d_model 512, 8
heads, batch 4, float32, causal. Ours is `attention_jax.MultiHeadAttention`
(each implementation in `--impls`; `chunked:scan` / `chunked:unrolled`
force a strategy of the chunked path), PyTorch's is nn.Linear projections around
`F.scaled_dot_product_attention(is_causal=True)` with the same weights. Both
outputs are checked equal before timing. Timed calls alternate A B A B …
after one warm-up each; medians and min–max are reported, with achieved
GFLOP/s as a fraction of this machine's measured float32 matmul peak.
Writes attention.json and attention.md into --out.
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx

import attention_jax as aj
from benchmarks import timing
from benchmarks.report import write_report

_LENGTHS = flags.DEFINE_list('lengths', ['128', '512', '1024', '2048', '4096'], 'Lengths.')
_IMPLS = flags.DEFINE_list('impls', ['chunked', 'dense'], 'Our implementations; '
                           'chunked:scan / chunked:unrolled force a chunked strategy.')
_DENSE_MAX = flags.DEFINE_integer('dense_max_length', 2048, 'Longest length for dense.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per implementation.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')
_PYTORCH = flags.DEFINE_bool('pytorch', True, 'Include PyTorch (else ratios to our first impl).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'],
                           'Inputs and weights of both sides (bfloat16: for GPUs).')

BATCH, D_MODEL, HEADS = 4, 512, 8


def matmul_peak_gflops() -> float:
  """Median GFLOP/s of a 2048² float32 matmul: this machine's practical peak."""
  a = jnp.ones((2048, 2048), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  f(a).block_until_ready()
  times = []
  for _ in range(10):
    start = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * 2048**3 / statistics.median(times) / 1e9


def layer_gflop(t: int) -> float:
  """Forward+backward FLOPs (backward ≈ 2× forward): four projections plus
  the causal half of QKᵀ and AV."""
  projections = 4 * 2 * BATCH * t * D_MODEL * D_MODEL
  attention = 2 * 2 * BATCH * t * t * D_MODEL / 2
  return 3 * (projections + attention) / 1e9


def ours(impl: str, x: np.ndarray, cotangent: np.ndarray):
  dtype = jnp.dtype(_DTYPE.value)
  impl, _, strategy = impl.partition(':')
  mha = aj.MultiHeadAttention(D_MODEL, HEADS, causal=True, implementation=impl, dtype=dtype,
                              param_dtype=dtype, chunked_strategy=strategy or 'auto',
                              rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(mha)

  @jax.jit
  def step(params, x, g):
    def loss(params, x):
      out = nnx.merge(graphdef, params)(x)  # causal by construction
      return jnp.sum(out * g), out
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return out, grads

  xj, gj = jnp.asarray(x, dtype), jnp.asarray(cotangent, dtype)
  run = lambda: jax.block_until_ready(step(params, xj, gj))
  return run, mha


def theirs(mha, x: np.ndarray, cotangent: np.ndarray):
  import torch  # pylint: disable=g-import-not-at-top  (benchmark-only dependency)
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  dtype = getattr(torch, _DTYPE.value)
  def linear(kernel):  # ours [in, H, D] or [H, D, out] -> torch weight [out, in]
    w = np.asarray(kernel, np.float32).reshape(D_MODEL, D_MODEL)
    layer = torch.nn.Linear(D_MODEL, D_MODEL, bias=False)
    layer.weight.data = torch.from_numpy(np.ascontiguousarray(w.T))
    return layer.to(device=device, dtype=dtype)
  w_q, w_k, w_v, w_o = (linear(getattr(mha, n).kernel[...]) for n in ('W_Q', 'W_K', 'W_V', 'W_O'))
  xt = torch.from_numpy(x).to(device=device, dtype=dtype).requires_grad_(True)
  gt = torch.from_numpy(cotangent).to(device=device, dtype=dtype)
  sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
  split = lambda h: h.view(BATCH, -1, HEADS, D_MODEL // HEADS).transpose(1, 2)

  def run():
    for p in (xt, *w_q.parameters(), *w_k.parameters(), *w_v.parameters(), *w_o.parameters()):
      p.grad = None
    o = torch.nn.functional.scaled_dot_product_attention(
        split(w_q(xt)), split(w_k(xt)), split(w_v(xt)), is_causal=True)
    out = w_o(o.transpose(1, 2).reshape(BATCH, -1, D_MODEL))
    (out * gt).sum().backward()
    sync()
    return out
  return run


def main(argv):
  del argv
  peak = matmul_peak_gflops()
  print(f'float32 matmul peak: {peak:.0f} GFLOP/s')
  rows = []
  for t in map(int, _LENGTHS.value):
    rng = np.random.default_rng(t)
    x = rng.standard_normal((BATCH, t, D_MODEL), np.float32)
    g = rng.standard_normal((BATCH, t, D_MODEL), np.float32)
    runners = {}
    for impl in _IMPLS.value:
      if impl == 'dense' and t > _DENSE_MAX.value:
        continue
      runners[f'ours-{impl}'], mha = ours(impl, x, g)
    if _PYTORCH.value:
      runners['pytorch-sdpa'] = theirs(mha, x, g)
    baseline = 'pytorch-sdpa' if _PYTORCH.value else next(iter(runners))
    outputs = {name: np.asarray(run()[0], np.float32) if name.startswith('ours')
               else run().detach().float().cpu().numpy() for name, run in runners.items()}
    tol = 2e-4 if _DTYPE.value == 'float32' else 5e-2  # bfloat16: 8 mantissa bits
    for name, out in outputs.items():  # equal outputs before any timing
      np.testing.assert_allclose(out, outputs[baseline], atol=tol, rtol=tol,
                                 err_msg=name)
    times = timing.interleaved(runners, _REPEATS.value, warm_up=False)  # each ran once above
    ratio = timing.ratios(times, baseline)
    for name, ts in times.items():
      median = statistics.median(ts)
      rows.append(dict(length=t, impl=name, **timing.stats(ts),
                       ratio_to_pytorch=ratio[name], baseline=baseline,
                       gflops=layer_gflop(t) / median,
                       fraction_of_peak=layer_gflop(t) / median / peak))
      print(rows[-1], flush=True)
  lines = [f'float32 matmul peak {peak:.0f} GFLOP/s. Causal layer fwd+bwd, batch {BATCH}, '
           f'd_model {D_MODEL}, {HEADS} heads, {_DTYPE.value}, JAX on '
           f'{jax.devices()[0].device_kind}.', '',
           f"| T | implementation | median s (min–max) | × {rows[0]['baseline']} | GFLOP/s | "
           '% of peak |',
           '|---|---|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['length']} | {r['impl']} | {r['median_s']:.3f} ({r['min_s']:.3f}–"
                 f"{r['max_s']:.3f}) | {r['ratio_to_pytorch']:.2f} | {r['gflops']:.0f} | "
                 f"{100 * r['fraction_of_peak']:.0f}% |")
  write_report(_OUT.value, 'attention', dict(matmul_peak_gflops=peak, rows=rows), lines)


if __name__ == '__main__':
  app.run(main)
