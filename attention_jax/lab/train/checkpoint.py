"""Checkpoints of the whole training state, with orbax.

The state saved is the (model, optimizer) NNX state as a pure dict of arrays
plus the step; the data stream needs nothing else, since batch `step` is a
function of `(seed, step)`. Orbax writes each checkpoint to a temporary
folder and renames it when complete, so a checkpoint interrupted half-way is
never picked up by `restore_latest`.
"""

import os
from typing import Optional

import jax
import orbax.checkpoint as ocp
from flax import nnx


class Checkpointer:
  """Saves every `every` steps (and on demand), keeps the newest `keep`."""

  def __init__(self, directory: str, *, every: int, keep: int):
    self.every = every
    self.manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def restore_latest(self, state: nnx.State) -> tuple[nnx.State, int]:
    """`(state, step)` from the newest complete checkpoint, or `(state, 0)`."""
    step = self.manager.latest_step()
    if step is None:
      return state, 0
    pure = nnx.to_pure_dict(state)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, pure)
    restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
    nnx.replace_by_pure_dict(state, restored)
    return state, step

  def maybe_save(self, step: int, state: nnx.State, *, force: bool = False) -> bool:
    """Saves the state reached after `step` steps if due (or `force`)."""
    if not force and step % self.every:
      return False
    if self.manager.latest_step() == step:
      return False
    pure = nnx.to_pure_dict(state)
    if jax.process_count() == 1:
      pure = jax.device_get(pure)  # host copies: the next step may donate the buffers
    self.manager.save(step, args=ocp.args.StandardSave(pure))
    return True

  def close(self, state: Optional[nnx.State] = None, step: Optional[int] = None) -> None:
    """Waits for pending saves (saving `state` at `step` first, if given)."""
    if state is not None:
      self.maybe_save(step, state, force=True)
    self.manager.wait_until_finished()
    self.manager.close()
