"""The checks of one run's record: what its task, encoding and model must
agree on, asked of the facts `resolved.resolve` derived once.

A run's fields can each be fine (`field_checks`) and still not work
together: an encoding that cannot serve the positions the task reads at
eval.max_length, Abacus embeddings on a task without digits, a learned
table shorter than the longest sequence. `refusal(run)` says the first
such problem in one line naming the field and what would work, or None;
it runs before anything trains, so a limit never ends a trained run
unevaluated.
"""

from typing import Optional

from attention_jax.lab.config.encoding_probe import probe_encoding
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config import facts


def refusal(run: ResolvedRun) -> Optional[str]:
  """Why `run` cannot train and be evaluated as its config says; None if it can."""
  if run.config.model.kind != 'transformer':
    return _layout_refusal(run) or _grid_refusal(run)
  return (_grid_refusal(run) or _position_refusal(run) or _abacus_refusal(run)
          or _hints_refusal(run) or _table_refusal(run))


def _layout_refusal(run: ResolvedRun) -> Optional[str]:
  """A seq2seq model on a task without the seq2seq layout."""
  kind, task = run.config.model.kind, run.task
  if not task.has_seq2seq:
    return (f"model kind {kind!r} reads the seq2seq layout, which task "
            f"{task.name!r} does not have; use model.kind='transformer'.")
  return None


def _grid_refusal(run: ResolvedRun) -> Optional[str]:
  """`eval.grid` (operand lengths of a two-operand task) and its samples."""
  ev = run.config.eval
  grid = tuple(ev.get('grid', ()))
  if grid and run.task.fixed_lengths(1, 1).ndim != 2:
    return (f'eval.grid={grid!r} is a grid of two operand lengths; '
            f"task {run.task.name!r} has one input; set eval.grid=() (or use task 'addition').")
  bad = [n for n in grid if isinstance(n, bool) or not isinstance(n, int)
         or not 1 <= n <= ev.max_length]
  if bad:
    return (f'eval.grid contains {bad[0]!r}; each must be an integer in '
            f'1 … eval.max_length={ev.max_length}.')
  if grid and (ev.get('grid_samples', 0) or 0) < 1:
    return f"eval.grid_samples={ev.get('grid_samples')!r} must be >= 1."
  return None


def _position_refusal(run: ResolvedRun) -> Optional[str]:
  """The encoding's own limit on the positions the run reads
  (`check_position_range`: xPos's scales, a table's rows)."""
  m, spec = run.config.model, run.config.model.encoding
  options = dict((m.get('encoding_options') or {}).get(run.encoding) or {})
  try:  # no table size: the learned table's rows are `_table_refusal`'s
    encoding = probe_encoding(run.encoding, m, None, options)
  except (ValueError, TypeError):
    return None  # the field checks (kernel, options) name what is wrong
  hi = max(run.longest_sequence, run.randomized_max_position, run.coupled_max_position) - 1
  try:
    encoding.check_position_range(0, hi)
  except ValueError as e:
    return (f'eval.max_length={run.config.eval.max_length} on {run.task.name!r} reads '
            f'positions 0 … {hi}, past what {spec!r} serves: {e}')
  return None


def _label(run: ResolvedRun) -> str:
  return run.config.model.get('variant') or run.config.model.encoding


def _abacus_refusal(run: ResolvedRun) -> Optional[str]:
  """Abacus embeddings need digits, no index hints, and enough rows."""
  abacus, task, c = run.model_arguments.get('abacus'), run.task, run.config
  if not abacus:
    return None
  if not task.digit_tokens:
    return (f'{_label(run)!r}: Abacus embeddings (model.abacus) number the '
            f"digits of numbers, and task {task.name!r} has none; use task 'addition'.")
  if getattr(task, 'index_hints', False):
    return (f'{_label(run)!r}: Abacus embeddings count runs of consecutive '
            'digits, and index hints (task.index_hints) put a marker between every two, '
            'so every digit would be 1; use one or the other.')
  needed = facts.abacus_rows_needed(task, c.eval.max_length, c.task.train_max_length,
                                      abacus['max_k'])
  if abacus['rows'] < needed:
    return (f'model.abacus_embeddings={abacus["rows"]} is too small: numbers of up '
            f'to {task.max_number_length(c.eval.max_length)} digits (eval.max_length='
            f'{c.eval.max_length}) and training offsets up to abacus_max_k={abacus["max_k"]} '
            f'need ids 0 … {needed - 1}; set it >= {needed} or 0 (auto).')
  return None


def _hints_refusal(run: ResolvedRun) -> Optional[str]:
  """Index hints: not with coupled ids, and one marker per digit."""
  task, max_length = run.task, run.config.eval.max_length
  if not getattr(task, 'index_hints', False):
    return None
  if run.coupled_max_position:
    return (f'{_label(run)!r}: index hints (task.index_hints) and coupled '
            'positions do not combine: a hint token has no significance of its own; '
            'use one or the other.')
  longest = task.max_number_length(max_length)
  if task.num_hints < longest:
    return (f'task.num_hints={task.num_hints} is below the {longest} '
            f'digits of the longest number at eval.max_length={max_length}: two '
            f'digits of one number would share a marker; set task.num_hints >= {longest}.')
  return None


def _table_refusal(run: ResolvedRun) -> Optional[str]:
  """Randomized positions must cover the longest sequence; a learned table
  (`model.max_positions`, 0 = auto) the positions it is read at."""
  c, needed = run.config, run.longest_sequence
  table = c.model.max_positions if run.encoding == 'learned' else 0
  randomized = run.randomized_max_position
  where = f'eval.max_length={c.eval.max_length} on {run.task.name!r}'
  if randomized and randomized < needed:
    return (f'positions.max_position={c.positions.max_position} is below the {needed} '
            f'positions the model reads at {where}; set positions.max_position >= {needed} '
            'or 0 (auto).')
  if table and randomized and table < randomized:
    return (f'model.max_positions={table} is shorter than the randomized range '
            f'[0, {randomized}) of a learned table; set it to 0 (auto).')
  if table and table < needed:
    return (f"model.max_positions={table} is too short for 'learned' at {where}: the model "
            f'reads {needed} positions; set model.max_positions >= {needed} or 0 (auto).')
  return None
