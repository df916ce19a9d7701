"""Whether a config's evaluation can run at all, estimated before anything
trains: a study trains every model first, so an evaluation range that cannot
fit would otherwise be found after the training, grinding or out of memory.

Two estimates, both deliberately rough (a factor of a few either way), both
refusing only what is far out of reach, each naming the largest
`eval.max_length` that the same estimate lets through:

* memory: one evaluation call holds `eval.batch_size` sequences of the
  longest evaluated length, a few activations of the model's widest layer
  per token and, with `model.attention_implementation='dense'` (or a seq2seq
  model's attention), one score matrix per head, for every model evaluated
  at once (`models_at_once`: the seeds a program stacks, times the setups
  or groups side by side); refused above the machine's memory
  (`physical_memory`);
* work: the forward FLOPs of every evaluated sequence (weights 2·params per
  token, attention 4·d_model per query-key pair and layer): every length ×
  `eval.num_samples`, again for greedy generation (`eval.generate`) and for
  each RoPE context extension (`eval.rope_scalings`), plus addition's grid
  (`eval.grid`² cells × `eval.grid_samples`); refused above `MAX_EVAL_FLOPS`.
  DeepMind's suite evaluates every length eval.min_length … eval.max_length,
  and with `eval.cache` keeps every task's evaluation data in memory.

They read the evaluation's size and the model's depth and widths: they judge
the evaluation range, and leave a model too large for any length to the
out-of-memory handling of `runtime.entry_point`. `check` serves the decoder
studies (transformer or seq2seq), `check_encoder` DeepMind's suite.
"""

import dataclasses
import os
from typing import Callable, Sequence

import ml_collections

from attention_jax.lab import tasks
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.eval_lengths import eval_lengths
from attention_jax.lab.config.facts import task_of

# About a week at a sustained 1e12 FLOP/s (a CPU far above ours; a small
# fraction of an accelerator's peak): beyond it an evaluation is not a run.
MAX_EVAL_FLOPS = 6e17
LIVE_ACTIVATIONS = 8  # activations of one token alive at once in a forward (estimate)


def physical_memory() -> int:
  """The machine's memory in bytes (0 if the system does not say)."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return 0


@dataclasses.dataclass(frozen=True)
class _Model:
  """What the estimates read of a model: per-token weight FLOPs (2·params),
  attention FLOPs per query-key pair (all layers), the widest activation,
  and the score matrices (heads) one call holds at once (0: blockwise)."""
  weight_flops: float
  pair_flops: float
  width: int
  score_heads: int


def _transformer(m, mlp: int) -> _Model:
  params = m.num_layers * (4 * m.d_model ** 2 + 2 * m.d_model * mlp)
  dense = m.get('attention_implementation') == 'dense'
  return _Model(2 * params, 4 * m.d_model * m.num_layers, max(mlp, m.d_model),
                m.num_heads if dense else 0)


def _seq2seq(m) -> _Model:
  e, h = m.d_model, m.rnn_hidden_dim
  params = 3 * h * (e + h) * (2 if m.bidirectional else 1) + 3 * h * (e + 2 * h)
  attention = m.kind == 'seq2seq_attention'
  return _Model(2 * params, 4 * h if attention else 0, 2 * h, 1 if attention else 0)


def _cost(model: _Model, sizes: Sequence[tuple[int, int]], longest: int, batch_size: int):
  """(bytes of one call at `longest` tokens, FLOPs of `sizes`: (tokens, sequences))."""
  memory = 4 * batch_size * longest * (model.width * LIVE_ACTIVATIONS + model.score_heads * longest)
  flops = sum(count * (model.weight_flops * t + model.pair_flops * t * t) for t, count in sizes)
  return memory, flops


def models_at_once(config: ml_collections.ConfigDict, *, stacked_seeds: bool) -> int:
  """Models whose evaluations are in memory together: `study.seeds` when
  one program stacks them (`stacked_seeds`), times `study.parallel_setups`."""
  study = config.get('study') or {}
  seeds = len(study.get('seeds', ())) if stacked_seeds else 1
  return max(1, seeds) * max(1, study.get('parallel_setups', 1))


def _at_once_text(models: int) -> str:
  return (f' for each of the {models} models evaluated at once (study.seeds stacked × '
          'study.parallel_setups)' if models > 1 else '')


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int:
  """The largest n in [low, high] with fits(n), fits monotone; low - 1 if none."""
  if not fits(low):
    return low - 1
  while low < high:
    mid = (low + high + 1) // 2
    low, high = (mid, high) if fits(mid) else (low, mid - 1)
  return low


def _refuse(where: str, max_length: int, memory: float, flops: float, batch_size: int,
            longest: int, what: str, fits: Callable[[int], bool], floor: int,
            extra: str = '', models: int = 1) -> None:
  """The ConfigError of `check`/`check_encoder` if an estimate is out of reach."""
  limit = physical_memory()
  over_memory = limit and memory > limit
  if not over_memory and flops <= MAX_EVAL_FLOPS:
    return
  bound = _largest(fits, floor, max_length - 1)
  fix = (f'eval.max_length <= {bound:,} fits' if bound >= floor else
         f'no eval.max_length >= {floor} fits with these sizes')
  at_once = _at_once_text(models)
  fewer = ', study.parallel_setups' if models > 1 else ''
  if over_memory and bound < floor:  # not the lengths: the batch or the model is too large
    raise ConfigError(
        f'invalid config: one evaluation call of eval.batch_size={batch_size}{extra}{at_once} '
        f'needs about {memory / 2**30:,.0f} GiB at eval.max_length={max_length} on {where}, '
        f'more than this machine\'s {limit / 2**30:,.0f} GiB, and {fix}; reduce '
        f'eval.batch_size{fewer} or the model (model.d_model, model.num_layers, model.mlp_dim).')
  if over_memory:
    raise ConfigError(
        f'invalid config: eval.max_length={max_length} on {where}: the model reads '
        f'{longest:,} tokens per sequence, and one evaluation call of eval.batch_size='
        f'{batch_size}{extra}{at_once} needs about {memory / 2**30:,.0f} GiB, more than this '
        f'machine\'s {limit / 2**30:,.0f} GiB; lower eval.max_length or eval.batch_size{fewer}'
        f'{" or set eval.cache=False" if extra else ""} ({fix}).')
  raise ConfigError(
      f'invalid config: eval.max_length={max_length} on {where}: evaluating {what} is about '
      f'{flops:.1e} FLOPs, above the limit of {MAX_EVAL_FLOPS:.0e} (about a week at 1e12 '
      f'FLOP/s); lower eval.max_length, eval.lengths or eval.num_samples ({fix}).')


def _decoder_cost(config: ml_collections.ConfigDict, max_length: int, models: int = 1):
  """`_cost` of a decoder study's evaluation with eval.max_length = max_length,
  the memory of `models` evaluated at once."""
  m, e = config.model, config.eval
  c = config.copy_and_resolve_references()
  c.eval.max_length = max_length
  task = task_of(c)
  model = _seq2seq(m) if m.kind != 'transformer' else _transformer(
      m, m.get('mlp_dim') or 4 * m.d_model)
  lengths = [n for n in eval_lengths(c) if n <= max_length] or [max_length]
  passes = 1 + bool(e.get('generate') and m.kind == 'transformer')
  if m.kind == 'transformer' and m.encoding.split(':')[0] == 'rope':
    passes += len(e.get('rope_scalings', ()))
  passes *= 1 + len(e.get('tasks', ()))  # each task of eval.tasks is scored the same way
  sizes = [(tasks.tokens_read(task, n), passes * e.num_samples) for n in lengths]
  grid = [n for n in e.get('grid', ()) if n <= max_length]
  sizes += [(tasks.tokens_read(task, max(a, b)), e.get('grid_samples', 0))
            for a in grid for b in grid]
  longest = tasks.tokens_read(task, max(lengths))
  memory, flops = _cost(model, sizes, longest, e.batch_size)
  return models * memory, flops, longest, len(lengths)


def check(config: ml_collections.ConfigDict, models: int = 1) -> None:
  """ConfigError naming eval.max_length, the fields that set the size and
  the largest eval.max_length that fits, when a decoder study's evaluation
  cannot fit (module docstring); `models`: evaluated at once (`models_at_once`)."""
  e = config.eval
  memory, flops, longest, count = _decoder_cost(config, e.max_length, models)

  def fits(n):
    mem, work, _, _ = _decoder_cost(config, n, models)
    return (not physical_memory() or mem <= physical_memory()) and work <= MAX_EVAL_FLOPS

  _refuse(repr(config.task.name), e.max_length, memory, flops, e.batch_size, longest,
          f'{count} lengths × eval.num_samples={e.num_samples}', fits,
          config.task.train_max_length, models=models)


def _encoder_cost(config: ml_collections.ConfigDict, specs: list, max_length: int):
  """`_cost` of DeepMind's suite's evaluation of every task in `specs` (every
  length eval.min_length … max_length, `encoder_layout.padded_slots` tokens each)."""
  from attention_jax.lab.protocols import encoder_layout  # pylint: disable=g-import-not-at-top
  m, e = config.model, config.eval
  model = _transformer(m, m.mlp_factor * m.d_model)  # attention 'auto': blockwise when long
  sizes, longest = [], 0
  for spec in specs:
    step = max(1, (max_length - e.min_length) // 200)  # a sample of the lengths, weighted
    for n in range(e.min_length, max_length + 1, step):
      sizes.append((encoder_layout.padded_slots(spec, n), e.num_samples * min(step, max_length + 1 - n)))
    longest = max(longest, encoder_layout.padded_slots(spec, max_length))
  memory, flops = _cost(model, sizes, longest, e.batch_size)
  memory *= models_at_once(config, stacked_seeds=True)  # the suite stacks its seeds
  if e.get('cache', False):  # every task's evaluation data kept: ~4 int32 arrays per slot
    memory += 16 * sum(t * count for t, count in sizes)
  return memory, flops, longest


def check_encoder(config: ml_collections.ConfigDict) -> None:
  """`check` for DeepMind's suite (configs/chomsky.py): every task of
  `study.tasks` at every length eval.min_length … eval.max_length."""
  e = config.eval
  specs = [tasks.get_spec(n) for n in config.study.tasks if n in tasks.SPECS]
  if not specs:
    return
  memory, flops, longest = _encoder_cost(config, specs, e.max_length)

  def fits(n):
    mem, work, _ = _encoder_cost(config, specs, n)
    return (not physical_memory() or mem <= physical_memory()) and work <= MAX_EVAL_FLOPS

  _refuse(f'{len(specs)} task{"s" * (len(specs) != 1)}', e.max_length, memory, flops,
          e.batch_size, longest, f'{e.max_length - e.min_length + 1:,} lengths × '
          f'eval.num_samples={e.num_samples}', fits, config.task.train_max_length + 2,
          ' with the data eval.cache keeps' if e.get('cache', False) else '',
          models=models_at_once(config, stacked_seeds=True))
