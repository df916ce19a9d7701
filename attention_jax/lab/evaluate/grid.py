"""Exact match over (digits of a) × (digits of b): the grid figure of the
addition papers (McLeish et al. 2024 Fig. 1, Cho et al. 2024), with the
training region marked.

Each cell is scored under teacher forcing: exact match there equals greedy
generation's by construction (`evaluate/lengths.py`), at one forward pass a
batch. Cells are grouped by the longer operand into `lengths.buckets` (one
compiled program per bucket and architecture, as the per-length
evaluation), the seeds of a setup stacked into one program. Each cell's
data depend on `(eval_seed, la, lb)` only: every model is scored on the same
sums.
"""

import functools
import math
import os
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.lab.report import result_files
from attention_jax.lab.evaluate.lengths import buckets
from attention_jax.lab.evaluate.lengths import evaluation_program
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.lab.train.interrupt import raise_if_stopped

GRID_FIELDS = ('task', 'encoding', 'seed', 'digits_a', 'digits_b', 'exact_match',
               'token_accuracy')
GRID_FILE = 'grid.csv'


def grid_keys(eval_seed: int, la: int, lb: int, num_batches: int) -> jax.Array:
  """The keys of cell (la, lb)'s batches: the data of every model."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(eval_seed), la), 1_000_003 + lb)
  return jax.random.split(key, num_batches)


def evaluate_grid(trained: list[nnx.Module], task, grid: Sequence[int], *, train_max: int,
                  num_samples: int, vocab_size: int, eval_seed: int = 12345,
                  batch_size: int = 256, max_position: int = 0, draw: str = 'per_example',
                  clock: Optional[Stopwatch] = None) -> list[list[dict]]:
  """For each model (one architecture, e.g. the seeds of a setup): one row
  `{'digits_a', 'digits_b', 'exact_match', 'token_accuracy'}` per pair of
  `grid` lengths, over `num_samples` sums each."""
  clock = clock or Stopwatch()
  stacked = len(trained) > 1
  splits = [nnx.split(m) for m in trained]
  graphdef = splits[0][0]
  state = (jax.tree.map(lambda *xs: jnp.stack(xs), *(s for _, s in splits)) if stacked
           else splits[0][1])
  batch_size = min(batch_size, num_samples)
  num_batches = math.ceil(num_samples / batch_size)
  per_model = (lambda r, i: r[i]) if stacked else (lambda r, i: r)
  pairs = sorted({(a, b) for a in grid for b in grid}, key=lambda p: (max(p), p))
  rows = [[] for _ in trained]
  for bucket, longest in buckets(sorted({max(p) for p in pairs}), train_max).items():
    program = functools.partial(
        evaluation_program, graphdef=graphdef, task=task, bucket=bucket,
        num_samples=batch_size, vocab_size=vocab_size, max_position=max_position,
        draw=draw, stacked=stacked)()
    for la, lb in (p for p in pairs if max(p) in longest):
      raise_if_stopped()
      with clock.stage('grid'):
        out = jax.device_get([program(state, key, jnp.array([la, lb], jnp.int32))
                              for key in grid_keys(eval_seed, la, lb, num_batches)])
      for i, model_rows in enumerate(rows):
        model_rows.append(dict(
            digits_a=la, digits_b=lb,
            **{k: float(np.mean([per_model(r[k], i) for r in out]))
               for k in ('exact_match', 'token_accuracy')}))
  return rows


def figure_name(rows: Sequence[dict]) -> str:
  """The grid figure's file: TASK_grid.png (`addition_grid.png`), the
  tasks of `rows` joined by '_' where a study has several."""
  return '_'.join(sorted({r['task'] for r in rows})) + '_grid.png'


def write_grid(path: str, rows: Sequence[dict]) -> None:
  result_files.write_table(path, GRID_FIELDS, rows)


def read_grid(path: str) -> list[dict]:
  """A grid.csv's rows, numbers parsed; a ValueError names a damaged file."""
  return result_files.read_table(path, GRID_FIELDS, dict(
      seed=int, digits_a=int, digits_b=int, exact_match=float, token_accuracy=float),
                            'a grid table')


def run_grid_path(run_dir: str) -> str:
  return os.path.join(run_dir, GRID_FILE)


def grid_markdown(rows: Sequence[dict], train_max: int) -> str:
  """Per label: exact match (mean over seeds, %) per (digits of a) × (digits
  of b), cells inside the training range starred."""
  if not rows:
    return ''
  lines = ['### Exact match over (digits of a) × (digits of b)', '',
           f'Mean over seeds, percent; * marks cells inside the training range (both '
           f'operands <= {train_max} digits). Teacher-forced (equal to greedy by construction).',
           '']
  for task, label in sorted({(r['task'], r['encoding']) for r in rows}):
    sel = [r for r in rows if r['task'] == task and r['encoding'] == label]
    sizes = sorted({r['digits_a'] for r in sel})
    lines += [f'#### {task}, {label}', '',
              '| a \\ b | ' + ' | '.join(map(str, sizes)) + ' |', '|' + '---|' * (len(sizes) + 1)]
    for la in sizes:
      cells = []
      for lb in sizes:
        values = [r['exact_match'] for r in sel if r['digits_a'] == la and r['digits_b'] == lb]
        star = '*' if max(la, lb) <= train_max else ''
        cells.append(f'{100 * np.mean(values):.0f}{star}' if values else '—')
      lines.append(f'| {la} | ' + ' | '.join(cells) + ' |')
    lines.append('')
  return '\n'.join(lines)
