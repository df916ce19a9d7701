r"""PaTH attention, blockwise vs dense, beside FoX: time and peak memory.

  python -m benchmarks.path_attention [--lengths=1024,4096] \
      [--impls=path_blockwise,path_blockwise_stored,path_dense,fox] \
      [--out=benchmarks/results]

Causal attention forward+backward (gradients w.r.t. q, k, v, w, β and the
gates) through `scaled_dot_product_attention`:

* `path_blockwise`: PaTH-FoX's specs (`HouseholderScores`, `DifferenceBias`)
  on the 'path_blockwise' kernel, O(T) memory, each query block's walk
  re-run in the backward pass;
* `path_blockwise_stored`: the same kernel's function with
  `rematerialize=False`: autodiff stores the walks (the other way to get
  gradients, O(T² D / C));
* `path_dense`: the same specs on the 'dense' kernel (the transformed
  logits materialised, O(T²));
* `fox`: forgetting attention alone (`DifferenceBias`) on 'auto' (the
  chunked kernel from 256 keys): what PaTH costs over its baseline.

Each (implementation, length) runs in its own process, so its peak resident
memory (ru_maxrss) is its own: batch 1, `--heads` heads of `--head_dim`,
float32, blocks of 64. One warm-up call (compilation) and `--repeats` timed
calls; the median is reported, with each row's ratio to `fox` at its
length. Writes path_attention.json and path_attention.md into --out.
"""

from absl import app
from absl import flags

from benchmarks import timing
from benchmarks.report import write_report

_LENGTHS = flags.DEFINE_list('lengths', ['1024', '4096'], 'Sequence lengths.')
_IMPLS = flags.DEFINE_list('impls', ['path_blockwise', 'path_blockwise_stored', 'path_dense',
                                     'fox'],
                           'Implementations.')
_HEADS = flags.DEFINE_integer('heads', 4, 'Attention heads.')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head dimension.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per configuration.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')
_CHILD = flags.DEFINE_string('child', None, 'Internal: run one configuration "impl,T".')


def _child(impl: str, length: int, heads: int, head_dim: int, repeats: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import attention_jax as aj  # pylint: disable=g-import-not-at-top
  from attention_jax.attention.path_blockwise import path_attention  # pylint: disable=g-import-not-at-top

  keys = jax.random.split(jax.random.key(0), 6)
  q, k, v, w = (jax.random.normal(kk, (1, length, heads, head_dim)) for kk in keys[:4])
  w = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
  beta = jax.random.uniform(keys[4], (1, length, heads), minval=0.0, maxval=2.0)
  log_f = jnp.log(jax.random.uniform(keys[5], (1, length, heads), minval=0.9, maxval=1.0))

  def f(q, k, v, w, beta, log_f):
    c = jnp.cumsum(log_f, 1) * head_dim ** -0.5
    gate = aj.DifferenceBias(c, c)
    if impl == 'fox':
      return aj.scaled_dot_product_attention(q, k, v, score_bias=gate, causal=True)
    if impl == 'path_blockwise_stored':
      return path_attention(q, k, v, w, beta, (c, c), rematerialize=False)
    spec = aj.attention.HouseholderScores(q, k, w, beta)
    kernel = 'dense' if impl == 'path_dense' else 'path_blockwise'
    return aj.scaled_dot_product_attention(q, k, v, score_bias=(spec, gate), causal=True,
                                           implementation=kernel)

  step = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=range(6)))
  args = (q, k, v, w, beta, log_f)
  times = timing.interleaved({impl: lambda: step(*args)}, repeats)[impl]
  return dict(impl=impl, length=length, heads=heads, head_dim=head_dim,
              mode='forward+backward', **timing.stats(times), peak_rss_mib=timing.peak_rss_mib())


def main(argv):
  del argv
  if _CHILD.value:
    impl, length = _CHILD.value.split(',')
    timing.emit(_child(impl, int(length), _HEADS.value, _HEAD_DIM.value, _REPEATS.value))
    return
  rows = []
  for length in map(int, _LENGTHS.value):
    for impl in _IMPLS.value:
      rows.append(timing.run_child(
          'benchmarks.path_attention',
          [f'--child={impl},{length}', f'--heads={_HEADS.value}', f'--head_dim={_HEAD_DIM.value}',
           f'--repeats={_REPEATS.value}'], impl=impl, length=length))
      print(rows[-1], flush=True)
  base = {r['length']: r for r in rows if r['impl'] == 'fox' and 'error' not in r}
  table = ['| impl | T | median s (min–max) | × fox time | peak RSS MiB | × fox memory |',
           '|---|---|---|---|---|---|']
  for r in rows:
    if 'error' in r:
      table.append(f"| {r['impl']} | {r['length']} | failed: {r['error']} | — | — | — |")
      continue
    ref = base.get(r['length'])
    ratio = lambda key: f"{r[key] / ref[key]:.2f}" if ref else '—'
    table.append(f"| {r['impl']} | {r['length']} | {r['median_s']:.2f} "
                 f"({r['min_s']:.2f}–{r['max_s']:.2f}) | {ratio('median_s')} | "
                 f"{r['peak_rss_mib']:.0f} | {ratio('peak_rss_mib')} |")
  write_report(_OUT.value, 'path_attention', rows, table)


if __name__ == '__main__':
  app.run(main)
