"""The pure, compiled train step: `train_step(state, batch) -> (state, metrics)`.

The model and its optimizer travel as one NNX state pytree; `graphdef` (their
static structure) is closed over. `step_function` fuses batch generation from
`(seed, step)` into the same jitted function, with the state donated, so one
call is one XLA program and no data crosses from the host.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.lab.protocols import decoder
from attention_jax.lab import tasks
from attention_jax.lab.evaluate.scoring import masked_metrics


def _global_norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def train_step(graphdef: nnx.GraphDef, state: nnx.State,
               batch: dict[str, jax.Array]) -> tuple[nnx.State, dict[str, jax.Array]]:
  """One AdamW update of the (model, optimizer) `state` on `batch`."""
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    metrics = masked_metrics(decoder.forward_batch(model, batch), batch)
    return metrics['loss'], metrics

  grads, metrics = nnx.grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  metrics['grad_norm'] = _global_norm(grads)
  metrics['param_norm'] = _global_norm(nnx.state(model, nnx.Param))
  return nnx.state((model, optimizer)), metrics


@functools.lru_cache(maxsize=4)  # a few: see evaluate/lengths.py's evaluation_program
def step_function(*, graphdef: nnx.GraphDef, task: tasks.DecoderTask, batch_size: int,
                  min_length: int, max_length: int, vocab_size: int, layout: str,
                  data_sharding: Optional[jax.sharding.Sharding] = None,
                  max_position: int = 0, draw: str = 'per_example',
                  steps_per_call: int = 1, vmap_seeds: bool = False):
  """`(state, step, seed) -> (state, metrics)`: steps `step … step +
  steps_per_call - 1`, each generating its batch of `seed` on device and
  applying `train_step`, in one XLA program (a `lax.scan`), the state donated.
  Metrics come stacked, `[steps_per_call]` per key: one row per step.
  Several steps per call amortise the per-call cost (Python, dispatch,
  donation), a fifth of a step for the study's small model on CPU.

  Memoised on the static arguments (equal for runs of one architecture and
  data setup): the runs of a sweep share one jitted function and so one
  compilation, and each call passes only arrays — nothing static to hash per
  step, which matters when a step takes a few milliseconds. `seed` and `step`
  are traced. With `data_sharding`, the batch is laid out along it (data
  parallelism: XLA partitions the step and all-reduces the gradients).
  `max_position` > 0 trains on randomized positions drawn `draw`-wise
  (`tasks.train_batch`).

  `vmap_seeds`: the state carries a leading seed axis `[S, ...]` and `seed`
  is int32 `[S]`; each seed steps on its own batch stream, all in one
  program (`jax.vmap` over the seed axis), metrics `[steps_per_call, S]`.
  """

  def one_step(state, step, seed):
    batch = tasks.train_batch(task, seed, step, batch_size=batch_size,
                              min_length=min_length, max_length=max_length,
                              vocab_size=vocab_size, layout=layout,
                              max_position=max_position, draw=draw)
    if data_sharding is not None:
      batch = jax.lax.with_sharding_constraint(batch, data_sharding)
    return train_step(graphdef, state, batch)

  body = jax.vmap(one_step, in_axes=(0, None, 0)) if vmap_seeds else one_step

  def step_fn(state, step, seed):
    offsets = jnp.arange(steps_per_call, dtype=jnp.int32)
    return jax.lax.scan(lambda s, i: body(s, step + i, seed), state, offsets)

  return jax.jit(step_fn, donate_argnums=0)

