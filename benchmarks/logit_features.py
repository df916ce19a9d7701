r"""What logit soft-capping and learned sink logits cost the chunked kernel:
causal forward+backward of `scaled_dot_product_attention(...,
implementation='chunked')` without them, with `logit_soft_cap=`, with
`sinks=` and with both, side by side.

  python -m benchmarks.logit_features --lengths=1024,4096

q, k, v `[B, T, H, D]` (float32 by default), the gradient w.r.t. q, k, v
(and the sink logits where given), jitted. Each variant's output is checked
against the 'dense' kernel's first at the lengths up to
--check_max_length. Timed calls alternate A B C D … after a warm-up;
medians, min–max and the ratio to the plain call. Writes
logit_features.json and logit_features.md into --out.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

import attention_jax as aj
from benchmarks import timing
from benchmarks.report import write_report

_LENGTHS = flags.DEFINE_list('lengths', ['1024', '4096'], 'Sequence lengths.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16', 'float16'], 'Inputs.')
_BATCH = flags.DEFINE_integer('batch', 2, 'Batch size.')
_HEADS = flags.DEFINE_integer('heads', 8, 'Query heads (and key/value heads).')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head width.')
_CAP = flags.DEFINE_float('cap', 50.0, 'The soft cap (Gemma 2: 50).')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per variant.')
_CHECK_MAX = flags.DEFINE_integer('check_max_length', 1024,
                                  'Check against dense up to this length.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')

VARIANTS = ('plain', 'soft_cap', 'sinks', 'both')


def step_for(variant: str, cap: float, implementation: str = 'chunked'):
  """The jitted forward+backward of one variant: (q, k, v, sinks, g) ->
  ((loss, out), grads w.r.t. q, k, v and sinks)."""
  soft_cap = cap if variant in ('soft_cap', 'both') else None
  with_sinks = variant in ('sinks', 'both')

  def loss(q, k, v, sinks, g):
    out = aj.scaled_dot_product_attention(
        q, k, v, causal=True, implementation=implementation, logit_soft_cap=soft_cap,
        sinks=sinks if with_sinks else None)
    return jnp.sum(out.astype(jnp.float32) * g), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  b, h, d = _BATCH.value, _HEADS.value, _HEAD_DIM.value
  tol = 2e-4 if dtype == jnp.float32 else 5e-2
  rows = []
  for t in map(int, _LENGTHS.value):
    keys = jax.random.split(jax.random.key(t), 5)
    q, k, v = (jax.random.normal(kk, (b, t, h, d)).astype(dtype) for kk in keys[:3])
    sinks = jax.random.normal(keys[3], (h,))
    g = jax.random.normal(keys[4], (b, t, h, d))
    args = (q, k, v, sinks, g)
    runners = {}
    for variant in VARIANTS:
      runners[variant] = step_for(variant, _CAP.value).lower(*args).compile()
      got = jax.block_until_ready(runners[variant](*args))
      if t <= _CHECK_MAX.value:  # equal to dense before timing
        want = step_for(variant, _CAP.value, 'dense')(*args)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
          np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                     atol=tol * max(1.0, float(np.abs(y).max())), rtol=tol,
                                     err_msg=f'{variant} vs dense at T={t}')
    times = timing.interleaved({variant: lambda c=compiled: c(*args)
                                for variant, compiled in runners.items()},
                               _REPEATS.value, warm_up=False)  # each ran once above
    ratio = timing.ratios(times, 'plain')
    for variant, ts in times.items():
      rows.append(dict(length=t, variant=variant, **timing.stats(ts), ratio=ratio[variant]))
      print(rows[-1], flush=True)
  lines = [f"Chunked causal attention fwd+bwd, batch {b}, {h} heads of {d}, {_DTYPE.value}, "
           f"cap {_CAP.value}, {_REPEATS.value} timed calls each, JAX {jax.__version__} on "
           f"{jax.devices()[0].device_kind}.", '',
           '| T | variant | median s (min–max) | × plain |', '|---|---|---|---|']
  for r in rows:
    lines.append(f"| {r['length']} | {r['variant']} | {r['median_s']:.4f} "
                 f"({r['min_s']:.4f}–{r['max_s']:.4f}) | {r['ratio']:.2f} |")
  write_report(_OUT.value, 'logit_features', dict(rows=rows), lines)


if __name__ == '__main__':
  app.run(main)
