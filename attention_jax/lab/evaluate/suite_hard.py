"""The suite's hard set: each setting's trained models scored on
`tasks.hard_cases.chomsky_cases` at every evaluated length, beside the
uniform score.

Laid out by the suite's own `encoder_layout.encoder_batch` (the task's labels
applied to the given inputs, padded to the length's bucket as the uniform
evaluation pads it) and scored per input: exact when every output slot the
task's accuracy mask counts is right. Randomized encodings draw their
positions from a key of the evaluation seed and the length. Dropout is off
unless `eval.deterministic=False`, as in the uniform evaluation.

A length's cases are padded to a multiple of `ROWS` by repeating its last
case (the repeats are not scored), so that every length and task of one
padded shape shares one compiled program per encoding, not one per case
count. Padding changes no real row: the rows are independent, the
randomized positions are one draw per batch, and a dropout mask's first B
rows are the same whatever rows follow (JAX's counter-based random bits).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.train import suite_programs
from attention_jax.lab.train import suite_trainer
from attention_jax.lab.tasks import hard_cases
from attention_jax.lab.tasks.chomsky import regular
from attention_jax.lab.tasks.chomsky import strings
from attention_jax.lab.tasks.spec import TaskSpec

# Each task's official rule on given inputs `(x [B, N], n) -> y`.
LABELS = {
    'even_pairs': regular.label_even_pairs,
    'parity_check': regular.label_parity_check,
    'cycle_navigation': regular.label_cycle_navigation,
    'reverse_string': strings.label_reverse,
    'duplicate_string': strings.label_duplicate,
    'odds_first': strings.label_odds_first,
    'bucket_sort': strings.label_bucket_sort,
}
# A length's cases are padded to a multiple of this many rows (module docstring).
ROWS = 8


def has_cases(task: TaskSpec) -> bool:
  return task.name in LABELS and task.name in hard_cases.CHOMSKY


def fixed_spec(task: TaskSpec, inputs: list[list[int]]) -> TaskSpec:
  """`task` whose draw gives `inputs` (all of one length n) and their labels."""
  label = LABELS[task.name]

  def generate(key, n, batch_size, max_length):
    del key
    if batch_size != len(inputs):
      raise ValueError(f'{task.name}: {len(inputs)} hard inputs, asked for {batch_size}.')
    x = jnp.asarray([list(s) + [0] * (max_length - len(s)) for s in inputs], jnp.int32)
    return x, label(x, n)

  return dataclasses.replace(task, generate=generate)


def batches(task: TaskSpec, config) -> list[tuple[list[str], int, dict]]:
  """Per evaluated length with hard cases: their names, the length, and the
  encoder batch (`encoder_layout.encoder_batch`'s arrays `[B, T]`, with the
  task's class count and a noise key)."""
  e = config.eval
  bucket = e.bucket or e.max_length
  out = []
  for n in suite_trainer.evaluation_lengths(config):
    found = hard_cases.chomsky_cases(task, n)
    if not found:
      continue
    padded = min(e.max_length, bucket * math.ceil(n / bucket))
    slots = encoder_layout.padded_slots(task, padded)
    inputs = [x for _, x in found]
    inputs += inputs[-1:] * (-len(inputs) % ROWS)  # the repeats are not scored
    batch = encoder_layout.encoder_batch(fixed_spec(task, inputs), jax.random.key(0), n,
                                         batch_size=len(inputs), max_length=padded, slots=slots)
    key = jax.random.fold_in(jax.random.key(e.seed), 1_000_000 + n)
    batch.update(num_classes=jnp.full((1,), task.output_size, jnp.int32),
                 noise_key=jax.random.key_data(key),
                 dropout_key=jax.random.key_data(jax.random.fold_in(key, 1)))
    out.append(([c for c, _ in found], n, batch))
  return out


def _exact_program(programs, graphdef, rest, encoding: str):
  """jit (params [S, …], batch) -> exact bool [S, B]."""
  kind = suite_programs.noise_kind(encoding)
  dropout = not programs.config.eval.get('deterministic', True)

  def one(params, batch):
    batch = dict(batch)
    key = jax.random.wrap_key_data(batch.pop('noise_key'))
    dropout_key = jax.random.wrap_key_data(batch.pop('dropout_key'))
    logits = programs.forward(graphdef, rest, params, batch, key, kind,
                              dropout_key=dropout_key if dropout else None)
    right = (jnp.argmax(logits, -1) == batch['targets']) | ~batch['accuracy_mask']
    return jnp.all(right, axis=-1)

  return jax.jit(jax.vmap(one, in_axes=(0, None)))


def evaluate(programs, task: TaskSpec, encoding: str, graphdef, params, rest) -> list[list[dict]]:
  """Per seed (params stacked `[S, …]`): rows `{'length', 'case', 'count',
  'exact_match'}`; [] per seed for a task without a hard set."""
  seeds = jax.tree.leaves(params)[0].shape[0]
  rows = [[] for _ in range(seeds)]
  if not has_cases(task):
    return rows
  program = programs._get(  # pylint: disable=protected-access
      ('hard_exact', encoding), lambda: _exact_program(programs, graphdef, rest, encoding))
  # The batches depend on the task and the config alone: built once per task.
  found = programs._get(  # pylint: disable=protected-access
      ('hard_batches', task.name), lambda: batches(task, programs.config))
  for names, n, batch in found:
    exact = np.asarray(program(params, batch))
    for seed_rows, seed_exact in zip(rows, exact):
      groups: dict = {}
      for case, ok in zip(names, seed_exact):  # zip drops the padding rows
        groups.setdefault(case, []).append(bool(ok))
      seed_rows += [dict(length=n, case=c, count=len(v), exact_match=float(np.mean(v)))
                    for c, v in groups.items()]
  return rows


def exact_fraction(rows: list[dict]) -> float:
  """Exact match over every hard input of `rows` (count-weighted); NaN if none."""
  count = sum(r['count'] for r in rows)
  return sum(r['exact_match'] * r['count'] for r in rows) / count if count else float('nan')
