r"""The kernel table side by side: attention forward+backward per kernel, per
score spec, per length, on whatever backend JAX runs on.

  python -m benchmarks.kernels --impls=cudnn,pallas_gpu,chunked,dense \
      --specs=none,alibi,difference,windows --lengths=1024,4096 --dtype=bfloat16

The call is `scaled_dot_product_attention(q, k, v, causal=True,
score_bias=SPEC, implementation=IMPL)` with q, k, v `[B, T, H, D]` and the
gradient w.r.t. all three, jitted. Specs: 'none', 'alibi' (`LinearBias`),
'difference' (`DifferenceBias`, forgetting attention's gates) and 'windows'
(`WindowBias`, Hard-ALiBi's windows 1 … H/2). A kernel that cannot serve a
call is listed with the dispatcher's reason, not timed. Each kernel's output
and gradients are checked against the first kernel that served the call
(float32: 2e-4; half precision: 5e-2). Timed calls alternate A B A B … after
a warm-up; medians and min–max are reported with the ratio to the first
kernel, and XLA's compiled temporary memory (`memory_analysis`) per kernel.
Writes kernels.json and kernels.md into --out.
"""


import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

import attention_jax as aj
from attention_jax.attention import scores
from benchmarks import timing
from benchmarks.report import write_report

_IMPLS = flags.DEFINE_list('impls', ['chunked', 'dense'], 'Kernels (keys of KERNELS).')
_SPECS = flags.DEFINE_list('specs', ['none', 'alibi'], 'none, alibi, difference, windows.')
_LENGTHS = flags.DEFINE_list('lengths', ['256', '1024'], 'Sequence lengths.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16', 'float16'], 'Inputs.')
_BATCH = flags.DEFINE_integer('batch', 2, 'Batch size.')
_HEADS = flags.DEFINE_integer('heads', 8, 'Query heads (and key/value heads).')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head width.')
_DENSE_MAX = flags.DEFINE_integer('dense_max_length', 4096, 'Longest length for dense.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per kernel.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')

SPECS = ('none', 'alibi', 'difference', 'windows')


def score_spec(name: str, b: int, h: int, t: int):
  """The score spec (`ScoreSpec`) of spec `name` for B, H, T (fixed seeds)."""
  if name == 'none':
    return scores.NoBias()
  if name == 'alibi':
    return scores.LinearBias(aj.positional.alibi_slopes(h))
  if name == 'difference':
    log_f = -jax.nn.softplus(jax.random.normal(jax.random.key(7), (b, h, t)))
    c = jnp.cumsum(jnp.swapaxes(log_f, 1, 2), 1)  # forgetting attention's c, [B, T, H]
    return scores.DifferenceBias(c, c)
  if name == 'windows':
    m = h // 2
    return scores.WindowBias(tuple([0] * m) + (None,) * (h - m),
                             tuple(range(m)) + (None,) * (h - m))
  raise app.UsageError(f'--specs: unknown spec {name!r}; choose from {SPECS}.')


def step_for(impl: str, spec):
  def loss(q, k, v, g):
    out = aj.attention.scaled_dot_product_attention(
        q, k, v, causal=True, score_bias=spec, implementation=impl)
    return jnp.sum(out.astype(jnp.float32) * g), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  b, h, d = _BATCH.value, _HEADS.value, _HEAD_DIM.value
  tol = 2e-4 if dtype == jnp.float32 else 5e-2
  rows, refused = [], []
  for spec_name in _SPECS.value:
    for t in map(int, _LENGTHS.value):
      spec = score_spec(spec_name, b, h, t)
      keys = jax.random.split(jax.random.key(t), 4)
      q, k, v = (jax.random.normal(kk, (b, t, h, d)).astype(dtype) for kk in keys[:3])
      g = jax.random.normal(keys[3], (b, t, h, d))
      runners, results = {}, {}
      for impl in _IMPLS.value:
        if impl == 'dense' and t > _DENSE_MAX.value:
          refused.append((spec_name, t, impl, f'T > --dense_max_length={_DENSE_MAX.value}'))
          continue
        step = step_for(impl, spec)
        try:
          compiled = step.lower(q, k, v, g).compile()
        except ValueError as e:  # the dispatcher's obstacles
          refused.append((spec_name, t, impl, str(e).split(': ', 1)[-1]))
          continue
        memory = compiled.memory_analysis()
        runners[impl] = (compiled, getattr(memory, 'temp_size_in_bytes', None))
        results[impl] = jax.block_until_ready(compiled(q, k, v, g))
      if not runners:
        continue
      first = next(iter(runners))
      for impl, result in results.items():  # equal outputs and gradients before timing
        for got, want in zip(jax.tree.leaves(result), jax.tree.leaves(results[first])):
          np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                     atol=tol * max(1.0, float(np.abs(want).max())),
                                     rtol=tol, err_msg=f'{impl} vs {first}')
      times = timing.interleaved({impl: lambda c=compiled: c(q, k, v, g)
                                  for impl, (compiled, _) in runners.items()},
                                 _REPEATS.value, warm_up=False)  # each ran once above
      ratio = timing.ratios(times, first)
      for impl, ts in times.items():
        rows.append(dict(spec=spec_name, length=t, impl=impl, **timing.stats(ts),
                         ratio=ratio[impl], baseline=first, temp_bytes=runners[impl][1]))
        print(rows[-1], flush=True)
  lines = [f'Causal attention fwd+bwd, batch {b}, {h} heads of {d}, {_DTYPE.value}, JAX '
           f'{jax.__version__} on {jax.devices()[0].device_kind}.', '',
           '| spec | T | kernel | median s (min–max) | × first | XLA temp MiB |',
           '|---|---|---|---|---|---|']
  for r in rows:
    mib = '' if r['temp_bytes'] is None else f"{r['temp_bytes'] / 2**20:.1f}"
    lines.append(f"| {r['spec']} | {r['length']} | {r['impl']} | {r['median_s']:.4f} "
                 f"({r['min_s']:.4f}–{r['max_s']:.4f}) | {r['ratio']:.2f} × {r['baseline']} "
                 f"| {mib} |")
  if refused:
    lines += ['', 'Not served (the dispatcher\'s reason):', '']
    lines += [f'- {s}, T={t}, {i}: {why}' for s, t, i, why in refused]
  write_report(_OUT.value, 'kernels', dict(rows=rows, refused=refused), lines)


if __name__ == '__main__':
  app.run(main)
