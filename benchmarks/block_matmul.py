r"""The matmuls inside one attention block: XLA:CPU vs PyTorch's bmm, side by side.

  pip install -r requirements-bench.txt
  python -m benchmarks.block_matmul [--heads=8] [--chunk=512] [--out=benchmarks/results]

`chunked_attention` spends most of its time in five batched matmuls per
(query block, key block) pair (two in the forward, five in the backward,
counting the recomputed scores once in each). This times each of them, on
exactly the shapes and layouts the chunked path uses by default
(`heads_per_step` rows × 512 × 512 blocks, head_dim 64), as a jitted
`jnp.einsum` and as `torch.bmm` on the same data. Each JAX call repeats the
matmul `--inner` times in a `lax.fori_loop` whose carry is added to the
smaller operand (so nothing can be hoisted out of the loop; that add, over at
most 8 × 512 × 64 floats, is charged to XLA) and dispatch is amortised;
PyTorch runs `--inner` times in a Python loop into a preallocated output.
Calls alternate A B A B …; medians and min–max of --repeats.
Writes block_matmul.json and block_matmul.md into --out.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import torch
from absl import app
from absl import flags

from benchmarks import timing
from benchmarks.report import write_report

_HEADS = flags.DEFINE_integer('heads', 8, 'Rows per block step (heads_per_step).')
_CHUNK = flags.DEFINE_integer('chunk', 512, 'q_chunk = k_chunk.')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head dimension.')
_INNER = flags.DEFINE_integer('inner', 20, 'Matmuls per timed call.')
_REPEATS = flags.DEFINE_integer('repeats', 7, 'Timed calls per side.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')

# name: (einsum, lhs shape letters, rhs shape letters) in chunked.py's layouts.
MATMULS = {
    'S = Q Kᵀ (forward)': ('gqd,gkd->gqk', 'gqd', 'gkd'),
    'O += P V (forward)': ('gqk,gkd->gqd', 'gqk', 'gkd'),
    'Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (backward)': ('gkd,gqd->gkq', 'gkd', 'gqd'),
    'dV += Pᵀ dO, dK += dSᵀ Q (backward)': ('gkq,gqd->gkd', 'gkq', 'gqd'),
    'dQᵀ += Kᵀ dSᵀ (backward)': ('gdk,gkq->gdq', 'gdk', 'gkq'),
}


def _torch_operand(x: np.ndarray, letters: str, spec: str) -> torch.Tensor:
  """The operand in the [g, m, k] / [g, k, n] form torch.bmm wants (a copy)."""
  lhs, rhs_out = spec.split(',')
  rhs, out = rhs_out.split('->')
  contracted = (set(lhs) & set(rhs)) - set(out)
  if letters == lhs:  # [g, m, k]: contracted axis last
    order = [letters.index(c) for c in 'g'] + [
        i for i, c in enumerate(letters) if c not in contracted and c != 'g'] + [
            letters.index(c) for c in contracted]
  else:  # [g, k, n]: contracted axis in the middle
    order = [letters.index(c) for c in 'g'] + [letters.index(c) for c in contracted] + [
        i for i, c in enumerate(letters) if c not in contracted and c != 'g']
  return torch.from_numpy(np.ascontiguousarray(np.transpose(x, order)))


def main(argv):
  del argv
  torch.set_num_threads(2)
  sizes = dict(g=_HEADS.value, q=_CHUNK.value, k=_CHUNK.value, d=_HEAD_DIM.value)
  rng = np.random.default_rng(0)
  rows = []
  for name, (spec, lhs_l, rhs_l) in MATMULS.items():
    lhs = rng.standard_normal([sizes[c] for c in lhs_l], np.float32)
    rhs = rng.standard_normal([sizes[c] for c in rhs_l], np.float32)
    gflop = 2 * np.prod(list(sizes.values())) / 1e9 * _INNER.value

    small_lhs = lhs.size <= rhs.size

    @jax.jit
    def ours(lhs, rhs, spec=spec, small_lhs=small_lhs):
      def body(_, acc):  # the product feeds the next call: nothing to hoist
        out = (jnp.einsum(spec, lhs + acc, rhs) if small_lhs
               else jnp.einsum(spec, lhs, rhs + acc))
        return acc + 1e-30 * out.reshape(-1)[0]
      return jax.lax.fori_loop(0, _INNER.value, body, jnp.float32(0))

    a_t, b_t = _torch_operand(lhs, lhs_l, spec), _torch_operand(rhs, rhs_l, spec)
    out_t = torch.empty(a_t.shape[0], a_t.shape[1], b_t.shape[2])
    expected = np.einsum(spec, lhs, rhs)
    got = torch.bmm(a_t, b_t).numpy()
    out_letters = spec.split('->')[1]
    np.testing.assert_allclose(  # the torch form computes the same product
        got.reshape(-1), np.transpose(expected, _bmm_order(spec)).reshape(-1),
        rtol=1e-3, atol=1e-3)
    jl, jr = jnp.asarray(lhs), jnp.asarray(rhs)
    runners = {
        'xla': lambda: jax.block_until_ready(ours(jl, jr)),
        'torch.bmm': lambda: [torch.bmm(a_t, b_t, out=out_t) for _ in range(_INNER.value)],
    }
    times = timing.interleaved(runners, _REPEATS.value)
    med = {n: statistics.median(t) for n, t in times.items()}
    rows.append(dict(matmul=name, einsum=spec, output=out_letters, sizes=sizes,
                     xla_gflops=gflop / med['xla'], torch_gflops=gflop / med['torch.bmm'],
                     xla_min_max=[min(times['xla']), max(times['xla'])],
                     ratio=med['xla'] / med['torch.bmm']))
    print(rows[-1], flush=True)
  lines = [f"Block matmuls, {sizes['g']} rows × {sizes['q']} × {sizes['k']}, head_dim "
           f"{sizes['d']}, float32, 2 threads each, median of {_REPEATS.value} calls of "
           f'{_INNER.value}.', '',
           '| matmul (einsum) | XLA:CPU GFLOP/s | torch.bmm GFLOP/s | time XLA / torch |',
           '|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['matmul']} (`{r['einsum']}`) | {r['xla_gflops']:.0f} | "
                 f"{r['torch_gflops']:.0f} | {r['ratio']:.2f} |")
  write_report(_OUT.value, 'block_matmul', dict(rows=rows), lines)


def _bmm_order(spec: str) -> list[int]:
  """Axes of the einsum's output in torch.bmm's [g, m, n] order."""
  lhs, rhs_out = spec.split(',')
  rhs, out = rhs_out.split('->')
  m = [c for c in lhs if c in out and c != 'g'][0]
  n = [c for c in rhs if c in out and c != 'g'][0]
  return [out.index('g'), out.index(m), out.index(n)]


if __name__ == '__main__':
  app.run(main)
