"""What a task allows, checked at config time: its options, the model kinds
that can read it, Abacus embeddings, index hints and the evaluation grid.
Each check returns one line naming the value and what is allowed, or None
(`validate.validate_config` raises it)."""

from typing import Optional, Sequence

import ml_collections

from attention_jax.lab.protocols import decoder


def _with_task(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  c = config.copy_and_resolve_references()
  c.task.name = name
  return c


def task_refusal(config: ml_collections.ConfigDict, task_names: Sequence[str],
                 kinds: Sequence[str]) -> Optional[str]:
  """The tasks' options and the model kinds (`study.models` or
  `model.kind`) that must read them: None when every pair works."""
  for name in task_names:
    c = _with_task(config, name)
    try:
      task = decoder.task_of(c)
      task.for_training(c.task)
    except ValueError as e:
      return f'task {name!r}: {e}'
    for kind in kinds:
      if kind != 'transformer' and not task.has_seq2seq:
        return (f"model kind {kind!r} reads the seq2seq layout, which task "
                f"{name!r} does not have; use model.kind='transformer'.")
    grid = tuple(c.eval.get('grid', ()))
    if grid and task.fixed_lengths(1, 1).ndim != 2:
      return (f'eval.grid={grid!r} is a grid of two operand lengths; '
              f"task {name!r} has one input; set eval.grid=() (or use task 'addition').")
    bad = [n for n in grid if isinstance(n, bool) or not isinstance(n, int)
           or not 1 <= n <= c.eval.max_length]
    if bad:
      return (f'eval.grid contains {bad[0]!r}; each must be an integer in '
              f'1 … eval.max_length={c.eval.max_length}.')
    if grid and (c.eval.get('grid_samples', 0) or 0) < 1:
      return f"eval.grid_samples={c.eval.get('grid_samples')!r} must be >= 1."
    try:
      decoder.evaluation_tasks(c)
    except ValueError as e:
      return f'task {name!r}: {e}'
  return None


def entry_refusal(config: ml_collections.ConfigDict, task_names: Sequence[str]) -> Optional[str]:
  """One transformer entry's config (`entries.entry_config`) on each task:
  Abacus embeddings, index hints and coupled ids; None when all work."""
  for name in task_names:
    c = _with_task(config, name)
    task = decoder.task_of(c)
    hints = getattr(task, 'index_hints', False)
    label = c.model.get('variant') or c.model.encoding
    if decoder.uses_abacus(c):
      k = c.model.get('abacus_max_k', 0)
      if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return f'model.abacus_max_k={k!r} must be an integer >= 0.'
      if not task.digit_tokens:
        return (f'{label!r}: Abacus embeddings (model.abacus) number the '
                f"digits of numbers, and task {name!r} has none; use task 'addition'.")
      if hints:
        return (f'{label!r}: Abacus embeddings count runs of consecutive '
                'digits, and index hints (task.index_hints) put a marker between every two, '
                'so every digit would be 1; use one or the other.')
      needed = decoder.abacus_embeddings(_auto_rows(c))
      rows = c.model.get('abacus_embeddings', 0)
      if rows and rows < needed:
        return (f'model.abacus_embeddings={rows} is too small: numbers of up '
                f'to {task.max_number_length(c.eval.max_length)} digits (eval.max_length='
                f'{c.eval.max_length}) and training offsets up to abacus_max_k={k} need ids '
                f'0 … {needed - 1}; set it >= {needed} or 0 (auto).')
    if hints and decoder.is_coupled(c):
      return (f'{label!r}: index hints (task.index_hints) and coupled '
              'positions do not combine: a hint token has no significance of its own; '
              'use one or the other.')
    if hints:
      longest = task.max_number_length(c.eval.max_length)
      if task.num_hints < longest:
        return (f'task.num_hints={task.num_hints} is below the {longest} '
                f'digits of the longest number at eval.max_length={c.eval.max_length}: two '
                f'digits of one number would share a marker; set task.num_hints >= {longest}.')
  return None


def _auto_rows(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with `model.abacus_embeddings` 0: what auto sizing needs."""
  c = config.copy_and_resolve_references()
  c.model.abacus_embeddings = 0
  return c
