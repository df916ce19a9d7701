r"""Peak memory and time of causal attention forward+backward, dense vs chunked.

  python -m benchmarks.attention_memory [--lengths=1024,4096,16384] \
      [--impls=dense,chunked] [--out=benchmarks/results]

Each (implementation, length) runs in its own process, so its peak resident
memory (ru_maxrss) is its own: batch 1, 8 heads of 64 (d_model 512), float32,
gradients w.r.t. q, k and v. One warm-up call (compilation) and
`--repeats` timed calls; the median is reported. Writes attention_memory.json
and attention_memory.md into --out.
"""

from absl import app
from absl import flags

from benchmarks import timing
from benchmarks.report import write_report

_LENGTHS = flags.DEFINE_list('lengths', ['1024', '4096', '16384'], 'Sequence lengths.')
_IMPLS = flags.DEFINE_list('impls', ['dense', 'chunked'], 'Implementations.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per configuration.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')
_FORWARD_ONLY = flags.DEFINE_bool('forward_only', False, 'Time the forward pass only '
                                   '(evaluation), not forward+backward.')
_CHILD = flags.DEFINE_string('child', None, 'Internal: run one configuration "impl,T".')

HEADS, HEAD_DIM = 8, 64


def _child(impl: str, length: int, repeats: int, forward_only: bool) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import attention_jax as aj  # pylint: disable=g-import-not-at-top

  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(kk, (1, length, HEADS, HEAD_DIM)) for kk in keys)
  if impl == 'dense':
    f = lambda q, k, v: aj.multi_head_attention(q, k, v, mask=aj.causal_mask(length))[0]
  else:
    f = lambda q, k, v: aj.chunked_attention(q, k, v, causal=True)
  if forward_only:
    step = jax.jit(f)
  else:
    step = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2),
                                      argnums=(0, 1, 2)))
  times = timing.interleaved({impl: lambda: step(q, k, v)}, repeats)[impl]
  return dict(impl=impl, length=length, mode='forward' if forward_only else 'forward+backward',
              **timing.stats(times), peak_rss_mib=timing.peak_rss_mib())


def main(argv):
  del argv
  if _CHILD.value:
    impl, length = _CHILD.value.split(',')
    timing.emit(_child(impl, int(length), _REPEATS.value, _FORWARD_ONLY.value))
    return
  rows = []
  for length in map(int, _LENGTHS.value):
    for impl in _IMPLS.value:
      rows.append(timing.run_child(
          'benchmarks.attention_memory',
          [f'--child={impl},{length}', f'--repeats={_REPEATS.value}',
           f'--forward_only={_FORWARD_ONLY.value}'], impl=impl, length=length))
      print(rows[-1], flush=True)
  table = ['| impl | T | mode | median s (min–max) | peak RSS MiB |', '|---|---|---|---|---|']
  for r in rows:
    if 'error' in r:
      table.append(f"| {r['impl']} | {r['length']} | — | failed: {r['error']} | — |")
    else:
      table.append(f"| {r['impl']} | {r['length']} | {r['mode']} | {r['median_s']:.2f} "
                   f"({r['min_s']:.2f}–{r['max_s']:.2f}) | {r['peak_rss_mib']:.0f} |")
  write_report(_OUT.value, 'attention_memory', rows, table)


if __name__ == '__main__':
  app.run(main)
