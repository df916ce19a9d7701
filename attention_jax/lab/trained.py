"""A finished run, loaded for use: its model, its task, and predictions from
raw inputs built the way the run was trained and evaluated.

    from attention_jax.lab import trained
    run = trained.load('runs/study/addition/windowed_rope+coupled/seed0')
    run.predict(123, 456)          # Prediction(output=579, …) if it learned
    run = trained.load('runs/one')  # an experiments.train workdir
    run.predict([3, 1, 4])         # copy: Prediction(output=[3, 1, 4], …)

`predict` takes what the task's `encode` takes (two integers for addition,
a sequence of input symbols for every `TaskSpec`), lays it out as the run's
evaluation does (`BOS x SEP …`, the coupled position ids of a ':coupled'
run, randomized positions where the run is evaluated on them, the Abacus
digit runs the model counts itself) and decodes greedily through the
key/value cache, up to the longest output the input can have. The model is
never run on positions it was not trained to read: a coupled run's ids come
from the task, and `generate(tokens)` on a coupled run without `positions`
is refused.
"""

import dataclasses
import functools
import inspect
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from attention_jax.lab.config import identity
from attention_jax.lab.protocols import decoder
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config.resolved import resolve
from attention_jax.lab import tasks
from attention_jax.lab.runs import workdirs
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs.workdir_checks import MADE_BY
from attention_jax.lab.runs.workdir_checks import held
from attention_jax.lab.train.loop import load_trained
from attention_jax.nn import TransformerLM
from attention_jax.nn.decoding import greedy_predictions
from attention_jax.positional.abacus import abacus_ids


@dataclasses.dataclass(frozen=True)
class Prediction:
  """What a run wrote for one input.

  output: the task's value (`task.decode`: an int for addition, a list of
    symbols otherwise), or None when the written tokens are not one.
  tokens: the tokens written, up to and without EOS (int list).
  finished: whether it wrote EOS within the longest output the input can have.
  """
  output: Any
  tokens: list
  finished: bool


@dataclasses.dataclass(frozen=True)
class Trained:
  """A finished run: `model` (a TransformerLM), the `config` it was trained
  with, its `task` (configured as in training) and `run_dir`."""
  model: nnx.Module
  config: ml_collections.ConfigDict
  task: Any
  run_dir: str

  def __post_init__(self):
    # The lab proves its own evaluation's Abacus ids against the table at
    # config time and builds models without the run-time check; inputs given
    # by hand are not proven, and an id past the table under `jit` would be
    # NaN logits (decoded as PAD), so a loaded run checks them.
    if getattr(self.model, 'abacus', None) is not None:
      self.model.abacus.check_ids = True

  @functools.cached_property
  def record(self) -> ResolvedRun:
    """The run's config resolved (`lab.config.resolved`): its position ranges."""
    return resolve(self.config)

  def predict(self, *inputs, key: Optional[jax.Array] = None) -> Prediction:
    """The run's greedy answer to one input (module docstring). `key`
    (default `jax.random.key(0)`) draws what the evaluation draws beside the
    input: addition's index-hint start, randomized positions."""
    batch = self.batch(*inputs, key=key)
    written = np.asarray(decoder.generate_batch(self.model, batch))[0]
    written = [int(t) for t in written[np.asarray(batch['loss_mask'])[0]]]
    finished = tasks.EOS in written
    written = written[:written.index(tasks.EOS)] if finished else written
    return Prediction(output=self.task.decode(written, vocab_size=self.config.task.vocab_size),
                      tokens=written, finished=finished)

  def batch(self, *inputs, key: Optional[jax.Array] = None) -> dict:
    """The one-example batch `predict` decodes: `inputs` int32 `[1, T]`
    (the prompt, placeholders after it), `loss_mask` bool `[1, T]` (the
    slots it writes) and `positions` `[1, T]` where the run reads them."""
    if not isinstance(self.model, TransformerLM):
      raise TypeError(f'predict serves transformer runs; {self.run_dir} holds a '
                      f'{type(self.model).__name__} (read its results.csv).')
    key = jax.random.key(0) if key is None else key
    self._check_arity(inputs)
    tokens, is_output, lengths = self.task.encode(
        *inputs, vocab_size=self.config.task.vocab_size, key=key)
    batch = dict(inputs=tokens[:, :-1], loss_mask=is_output[:, 1:])
    self._check_abacus_range(batch, inputs)
    if self.task.coupled_max_position:  # offset 1, as the evaluation's
      batch['positions'] = self.task.coupled_positions(
          tokens, lengths, jnp.ones((1,), jnp.int32))[:, :-1]
    max_position = self.record.eval_max_position
    if max_position:  # randomized positions, where the evaluation draws them
      batch = tasks.with_random_positions(batch, jax.random.fold_in(key, 2), max_position,
                                          self.config.positions.draw)
    return batch

  def _check_arity(self, inputs: tuple) -> None:
    """ValueError naming the raw inputs the task's `encode` takes, when
    `inputs` are not as many (copy takes one sequence, addition two ints)."""
    raw = [p.name for p in inspect.signature(self.task.encode).parameters.values()
           if p.name not in ('vocab_size', 'key') and p.kind is p.POSITIONAL_OR_KEYWORD]
    if len(inputs) != len(raw):
      example = '([3, 1, 4])' if raw == ['inputs'] else f'({", ".join(raw)})'
      raise ValueError(f'predict takes {len(raw)} input{"s" * (len(raw) != 1)} for task '
                       f'{self.task.name!r} ({", ".join(raw)}), got {len(inputs)}: '
                       f'predict{example}.')

  def _check_abacus_range(self, batch: dict, inputs: tuple) -> None:
    """ValueError naming `inputs` when writing their answer would read an
    Abacus id past the run's table: the tokens read up to the last output
    slot, the output's placeholders digits (its longest form)."""
    abacus = getattr(self.model, 'abacus', None)
    if abacus is None:
      return
    last = int(np.flatnonzero(np.asarray(batch['loss_mask'][0]))[-1])
    ids = abacus_ids(batch['inputs'][:, :last + 1], abacus.digit_tokens)
    longest = int(jnp.max(ids))
    if longest >= abacus.rows:
      shown = ', '.join(f'{name}={v!r}' for name, v in zip('ab', inputs)) if len(inputs) == 2 \
          else ', '.join(map(repr, inputs))
      raise ValueError(
          f'predict({shown}): its answer can have {longest} digits, and this run\'s Abacus '
          f'table numbers digits 1 … {abacus.rows - 1} (model.abacus_embeddings={abacus.rows}, '
          f'sized from eval.max_length={self.config.eval.max_length} and abacus_max_k='
          f'{abacus.max_k}): a digit past it has no embedding. Give operands of at most '
          f'{abacus.rows - 2} digits.')

  def generate(self, tokens: jax.Array, prompt_lengths: jax.Array,
               positions: Optional[jax.Array] = None) -> jax.Array:
    """Greedy decoding of token ids `[B, T]` (`nn.decoding.greedy_predictions`)
    at `positions` `[B, T]`; a coupled run needs them (its ids come from the
    task: `predict` builds them), so none is refused."""
    if self.task.coupled_max_position and positions is None:
      raise ValueError(f'{self.run_dir} was trained on coupled position ids '
                       f'({self.config.model.encoding}); generating at 0 … T-1 would read '
                       'positions it never saw: pass positions= (task.coupled_positions) or '
                       'use predict().')
    return greedy_predictions(self.model, tokens, prompt_lengths, positions)


def load(run_dir: str) -> Trained:
  """The finished run in `run_dir` (an experiments.train workdir, or one run
  of a study: `WORKDIR/TASK/LABEL/seedN`), restored from its final
  checkpoint; nothing is written. A study's workdir, a missing or unfinished
  run is a `ConfigError` saying which runs there are or what is missing."""
  if not os.path.isdir(run_dir):
    raise ConfigError(f'{run_dir}: no such folder; expected a run (config.json and '
                      'checkpoints/).')
  if held(run_dir) == 'suite':
    raise ConfigError(f'{run_dir} holds {MADE_BY["suite"]}, whose checkpoints hold the '
                      'tasks of a group trained in one program, which load does not read '
                      '(its results: results.csv and summary.md there); load a run of a '
                      'decoder study or of experiments.train.')
  config = identity.read_config(run_dir)
  if config is None:
    runs = sorted(os.path.relpath(os.path.dirname(p), run_dir)
                  for p in workdirs.run_files(run_dir, 'config.json'))
    if runs:
      raise ConfigError(f'{run_dir} is a study of {len(runs)} run{"s" * (len(runs) != 1)}; '
                        f'load one of them, e.g. '
                        f'{os.path.join(run_dir, runs[0])} (the others: '
                        f'{", ".join(runs[1:6])}{", …" if len(runs) > 6 else ""}).')
    raise ConfigError(f'{run_dir} holds no readable config.json; expected a trained run.')
  for module in config.get('imports', ()):
    __import__(module)
  run = resolve(config)
  return Trained(model=load_trained(run, run_dir), config=config, task=run.task,
                 run_dir=run_dir)
