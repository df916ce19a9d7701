"""Checkpoints of the whole training state, with orbax.

The state saved is the (model, optimizer) NNX state as a pure dict of arrays
plus the step; the data stream needs nothing else, since batch `step` is a
function of `(seed, step)`. Any other pytree of arrays (the suite's stacked
parameters, optimizer state and log) is saved as the list of its leaves and
restored into the structure of the pytree given. Orbax writes each checkpoint to a temporary
folder and renames it when complete, so a checkpoint interrupted half-way is
never picked up by `restore_latest`. A complete one damaged afterwards (a
truncated file: a full disk, a copy cut short) is reported by path and
skipped for the newest one that reads back.
"""

import functools
import os
import shutil
import threading
from typing import Optional

import jax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx


# Orbax keeps process-wide state for a save in flight (operation ids, the
# signals between a save and its commit thread): two threads' managers saving
# at once (a study's setups side by side) wait on each other's signals and
# time out. Every orbax call of this module holds this lock, and saves are
# synchronous, so a save is complete when the lock is released; the state is
# a few MB, a fraction of a second per save.
_ORBAX = threading.Lock()


def _one_at_a_time(method):
  @functools.wraps(method)
  def locked(*args, **kwargs):
    with _ORBAX:
      return method(*args, **kwargs)
  return locked


def _pure(state):
  """What orbax stores: an NNX state's pure dict, or any other pytree's
  leaves in a dict keyed by their place in `jax.tree.leaves`."""
  if isinstance(state, nnx.State):
    return nnx.to_pure_dict(state)
  return {f'{i:06d}': leaf for i, leaf in enumerate(jax.tree.leaves(state))}


def _first_line(error: Exception) -> str:
  text = str(error).strip().splitlines()
  return f'{type(error).__name__}: {text[0][:200] if text else ""}'


class Checkpointer:
  """Saves every `every` steps (and on demand), keeps the newest `keep`."""

  @_one_at_a_time
  def __init__(self, directory: str, *, every: int, keep: int):
    self.every = every
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=False))

  @_one_at_a_time
  def restore_latest(self, state, *, set_aside: bool = True) -> tuple:
    """`(state, step)` from the newest checkpoint that reads back, or
    `(state, 0)` with `state` untouched if none does.

    Unreadable checkpoints are named in one warning and, with `set_aside`,
    moved to `checkpoints.damaged/STEP` (kept for inspection; out of orbax's
    sight, so the run saves that step again when it gets there).
    """
    pure = _pure(state)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, pure)
    damaged, restored, step = [], None, 0
    for candidate in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(candidate, args=ocp.args.StandardRestore(abstract))
      except Exception as e:  # pylint: disable=broad-except
        # Truncated JSON metadata and truncated TensorStore data raise
        # unrelated types (JSONDecodeError, ValueError, a bare Exception)
        # that name no file; the path is what a user needs.
        damaged.append((candidate, e))
        continue
      step = candidate
      break
    if damaged:
      aside = self.directory + '.damaged'
      listed = '; '.join(f'{os.path.join(self.directory, str(s))} ({_first_line(e)})'
                         for s, e in damaged)
      outcome = (f'resuming from the checkpoint of step {step}' if restored is not None
                 else 'no readable checkpoint is left: training starts over from step 0')
      moved = f'; moved to {aside}/' if set_aside else ''
      logging.warning('unreadable checkpoint: %s; %s%s', listed, outcome, moved)
      if set_aside and jax.process_index() == 0:
        os.makedirs(aside, exist_ok=True)
        for s, _ in damaged:
          target = os.path.join(aside, str(s))
          shutil.rmtree(target, ignore_errors=True)  # an older damaged copy of that step
          shutil.move(os.path.join(self.directory, str(s)), target)
        self.manager.reload()
    if restored is None:
      return state, step
    if isinstance(state, nnx.State):
      nnx.replace_by_pure_dict(state, restored)
      return state, step
    leaves = [restored[key] for key in sorted(restored)]
    return jax.tree.unflatten(jax.tree.structure(state), leaves), step

  def maybe_save(self, step: int, state, *, force: bool = False) -> bool:
    """Saves the state reached after `step` steps if due (or `force`)."""
    with _ORBAX:
      return self._maybe_save(step, state, force)

  def _maybe_save(self, step, state, force) -> bool:
    if not force and step % self.every:
      return False
    if self.manager.latest_step() == step:
      return False
    pure = _pure(state)
    if jax.process_count() == 1:
      pure = jax.device_get(pure)  # host copies: the next step may donate the buffers
    self.manager.save(step, args=ocp.args.StandardSave(pure))
    return True

  def close(self, state: Optional[nnx.State] = None, step: Optional[int] = None) -> None:
    """Waits for pending saves (saving `state` at `step` first, if given)."""
    with _ORBAX:
      if state is not None:
        self._maybe_save(step, state, True)
      self.manager.wait_until_finished()
      self.manager.close()
