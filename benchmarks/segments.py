r"""Packed documents on the chunked kernel: causal forward+backward with
segment ids (`--documents` equal documents per row) against the same call
without them, side by side.

  python -m benchmarks.segments [--lengths=1024,4096] [--documents=4] \
      [--strategies=scan,unrolled] [--repeats=5] [--out=benchmarks/results]

Batch 1, 8 heads of 64 (d_model 512), float32, gradients w.r.t. q, k and v,
`scaled_dot_product_attention(implementation='chunked')`. Before timing,
the packed output is checked against each document run alone. One warm-up
call (compilation) each, then the two calls interleaved A B A B; medians,
min–max and the ratio with / without. 'scan' skips the key blocks of other
documents (about T · T/documents of work instead of T²/2), 'unrolled' masks
them (its blocks are static slices), so the two differ by design. Writes
segments.json and segments.md into --out.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

import attention_jax as aj
from benchmarks.report import interleaved_times
from benchmarks.report import write_report

_LENGTHS = flags.DEFINE_list('lengths', ['1024', '4096'], 'Sequence lengths.')
_DOCUMENTS = flags.DEFINE_integer('documents', 4, 'Equal documents packed in each row.')
_STRATEGIES = flags.DEFINE_list('strategies', ['scan', 'unrolled'], 'Chunked strategies.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per configuration.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output folder.')

HEADS, HEAD_DIM = 8, 64


def _step(strategy, ids):
  attend = lambda q, k, v: aj.scaled_dot_product_attention(
      q, k, v, causal=True, segment_ids=ids, implementation='chunked',
      chunked_strategy=strategy)
  grad = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(attend(q, k, v) ** 2),
                                    argnums=(0, 1, 2)))
  return jax.jit(attend), grad


def _check(strategy, ids, q, k, v, documents):
  """The packed output equals each document's own, run alone."""
  out = _step(strategy, ids)[0](q, k, v)
  length = q.shape[1] // documents
  alone = _step(strategy, None)[0]
  for d in range(documents):
    piece = slice(d * length, (d + 1) * length)
    np.testing.assert_allclose(out[:, piece], alone(q[:, piece], k[:, piece], v[:, piece]),
                               atol=1e-5)


def main(argv):
  del argv
  rows, documents = [], _DOCUMENTS.value
  for length in map(int, _LENGTHS.value):
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (1, length, HEADS, HEAD_DIM)) for kk in keys)
    ids = jnp.asarray(np.repeat(np.arange(documents), -(-length // documents))[None, :length],
                      jnp.int32)
    for strategy in _STRATEGIES.value:
      _check(strategy, ids, q, k, v, documents)
      steps = {'segments': _step(strategy, ids)[1], 'plain': _step(strategy, None)[1]}
      times = interleaved_times(
          {name: lambda step=step: jax.block_until_ready(step(q, k, v))
           for name, step in steps.items()}, _REPEATS.value)
      medians = {name: statistics.median(t) for name, t in times.items()}
      rows.append(dict(length=length, strategy=strategy, documents=documents,
                       times_s=times, median_s=medians,
                       ratio=medians['segments'] / medians['plain']))
      print(rows[-1], flush=True)
  table = [f'| T | strategy | with {documents} documents, median s (min–max) | '
           'without, median s (min–max) | with / without |', '|---|---|---|---|---|']
  for r in rows:
    cell = lambda name: (f"{r['median_s'][name]:.3f} ({min(r['times_s'][name]):.3f}–"
                         f"{max(r['times_s'][name]):.3f})")
    table.append(f"| {r['length']} | {r['strategy']} | {cell('segments')} | {cell('plain')} | "
                 f"{r['ratio']:.2f} |")
  write_report(_OUT.value, 'segments', rows, table)


if __name__ == '__main__':
  app.run(main)
