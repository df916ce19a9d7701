"""The hard evaluation set: each trained model scored on `tasks.hard_cases`
at every evaluated length, beside the uniform evaluation.

Scored as the uniform evaluation scores (`evaluate.lengths`): exact match
of `decoder.predict_batch` (teacher-forced argmax for the transformer, equal
to greedy decoding's exact match by construction; greedy decoding for
seq2seq models), each case laid out by the same batch functions, padded to
the same bucket of its length, at the same positions (coupled ids at
offset 1, randomized ones where the run is evaluated on them). RoPE scaling
variants (rope+pi, …) are not scored here.

A run's scores go to `hard.csv` in its directory, one row per (length,
case): how many inputs and the fraction exact. The file is current when it
holds exactly the cases the config's lengths have now (`is_current`); a
finished run without a current one (evaluated by older code, or before a
case was added) gets it from its final checkpoint (`ensure`), without
training and without touching its results.csv.
"""

import functools
import os
from typing import Callable, Optional, Sequence, Union

import jax
import ml_collections
import numpy as np
from flax import nnx

from attention_jax.lab.protocols import decoder
from attention_jax.lab.report import result_files
from attention_jax.lab import tasks
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.evaluate.lengths import PROGRAMS_KEPT
from attention_jax.lab.evaluate.lengths import buckets
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config.resolved import resolve
from attention_jax.lab.evaluate.scoring import prediction_metrics
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.lab.train.interrupt import raise_if_stopped

# A run's config, or its record (`config.resolved`).
RunConfig = Union[ml_collections.ConfigDict, ResolvedRun]
HARD_FILE = 'hard.csv'
HARD_FIELDS = ('task', 'encoding', 'seed', 'length', 'case', 'count', 'exact_match')
# The key of the draws beside the inputs (index hints' start, randomized positions).
KEY = 424242


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _program(graphdef):
  """`(state, batch) -> exact bool [B]`, jitted (one compilation per bucket shape)."""

  def exact(state, batch):
    model = nnx.merge(graphdef, state)
    predictions = decoder.predict_batch(model, batch)
    return prediction_metrics(predictions, batch, per_example=True)['exact']

  return jax.jit(exact)


def hard_batches(task, lengths: Sequence[int], *, train_max: int, vocab_size: int,
                 layout: str = 'decoder_only', max_position: int = 0,
                 draw: str = 'per_example') -> list[tuple[list[tuple[int, str]], dict]]:
  """Per bucket (`lengths.buckets`): the (length, case) of each example and
  the batch of all of them (`tasks.LAYOUTS[layout]`'s arrays `[B, T]`); []
  for a task without a hard set."""
  out = []
  if not task.hard_set:
    return out
  for bucket, bucket_lengths in buckets(sorted(lengths), train_max).items():
    labels, inputs = [], []
    for n in bucket_lengths:
      for case, value in task.hard_cases(n, vocab_size):
        labels.append((n, case))
        inputs.append(value)
    if not inputs:
      continue
    fixed = task.with_inputs(inputs, vocab_size, bucket)
    key = jax.random.key(KEY)
    batch = tasks.LAYOUTS[layout](fixed, key, fixed.lengths, vocab_size=vocab_size,
                                  max_input_length=bucket)
    if max_position:  # as `evaluate.lengths` draws them
      batch = tasks.with_random_positions(batch, jax.random.fold_in(key, 2), max_position, draw)
    out.append((labels, batch))
  return out


def score(labels: Sequence[tuple[int, str]], exact: np.ndarray) -> list[dict]:
  """Rows `{'length', 'case', 'count', 'exact_match'}` of per-example
  `exact` `[B]` labelled (length, case), in the labels' order."""
  groups: dict = {}
  for label, ok in zip(labels, np.asarray(exact)):
    groups.setdefault(label, []).append(bool(ok))
  return [dict(length=n, case=case, count=len(v), exact_match=float(np.mean(v)))
          for (n, case), v in groups.items()]


def evaluate_hard(trained: Sequence[nnx.Module], task, lengths: Sequence[int], *,
                  train_max: int, vocab_size: int, max_position: int = 0,
                  draw: str = 'per_example',
                  clock: Optional[Stopwatch] = None) -> list[list[dict]]:
  """`score`'s rows for each model (all of one task), on the same inputs."""
  clock = clock or Stopwatch()
  rows = [[] for _ in trained]
  if not trained:
    return rows
  layout = decoder.batch_layout(trained[0])
  for labels, batch in hard_batches(task, lengths, train_max=train_max, vocab_size=vocab_size,
                                    layout=layout, max_position=max_position, draw=draw):
    raise_if_stopped()
    for model, model_rows in zip(trained, rows):
      graphdef, state = nnx.split(model)
      with clock.stage('hard'):
        exact = jax.device_get(_program(graphdef)(state, batch))
      model_rows += score(labels, exact)
  return rows


def config_rows(trained: Sequence[nnx.Module], runs: Sequence[RunConfig],
                clock: Optional[Stopwatch] = None) -> list[list[dict]]:
  """`evaluate_hard` of models trained with `runs` (configs or their
  records, `config.resolved`: the seeds of one setup), each row with its
  task, encoding (the run's label) and seed."""
  runs = [resolve(r) for r in runs]
  run, config = runs[0], runs[0].config
  per_model = evaluate_hard(
      trained, run.task, run.eval_lengths, train_max=run.bucket_floor,
      vocab_size=config.task.vocab_size, max_position=run.eval_max_position,
      draw=config.positions.draw, clock=clock)
  return [[dict(task=c.task.name, encoding=run_label(c), seed=c.train.seed, **r) for r in rows]
          for c, rows in zip([r.config for r in runs], per_model)]


def expected_cases(config: RunConfig) -> set:
  """{(length, case, count)} the run's hard set holds (empty: no hard set)."""
  run = resolve(config)
  if not run.task.hard_set:
    return set()
  out = set()
  for n in run.eval_lengths:
    found: dict = {}
    for case, _ in run.task.hard_cases(n, run.config.task.vocab_size):
      found[case] = found.get(case, 0) + 1
    out |= {(n, case, count) for case, count in found.items()}
  return out


def run_hard_path(run_dir: str) -> str:
  return os.path.join(run_dir, HARD_FILE)


def write_hard(path: str, rows: Sequence[dict]) -> None:
  result_files.write_table(path, HARD_FIELDS, rows)


def read_hard(path: str) -> list[dict]:
  """A hard.csv's rows, numbers parsed; a ValueError names a damaged file."""
  return result_files.read_table(path, HARD_FIELDS, dict(seed=int, length=int, count=int,
                                                     exact_match=float), 'a hard-case table')


def is_current(run_dir: str, config: RunConfig) -> bool:
  """Whether `run_dir` has a hard.csv holding exactly `config`'s hard set
  (trivially true for a task without one)."""
  expected = expected_cases(config)
  if not expected:
    return True
  try:
    rows = read_hard(run_hard_path(run_dir))
  except (OSError, ValueError):
    return False
  return {(r['length'], r['case'], r['count']) for r in rows} == expected


def ensure(run_dir: str, config: RunConfig,
           load: Callable[[RunConfig, str], nnx.Module],
           log: Optional[Callable[[str], None]] = None) -> bool:
  """Writes a finished run's hard.csv from its final checkpoint (`load(config,
  run_dir)`) unless it is current; returns whether it evaluated."""
  if is_current(run_dir, config):
    return False
  if log:
    log(f'{run_dir}: finished earlier without the hard evaluation set; scoring it from the '
        'final checkpoint (no training)')
  model = load(config, run_dir)
  write_hard(run_hard_path(run_dir), config_rows([model], [config])[0])
  return True
