"""Why an encoding fails to extrapolate: attention maps and their entropy.

`attention_entropy` measures how spread out each query's attention is, in
nats: 0 for attention on a single key, log(k) for uniform attention over k
keys. On the copy task a working model attends sharply (to the token it is
copying), so its entropy stays low at every position; an encoding that has
lost track of position beyond the training length spreads its attention
out, and the entropy climbs toward the uniform curve log(i + 1).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.lab.protocols import decoder
from attention_jax.lab import tasks
from attention_jax.lab.evaluate import ambiguity
from attention_jax.lab.config.resolved import resolve
from attention_jax.lab.evaluate.lengths import evaluation_strings


def copy_examples(task: tasks.DecoderTask, length: int, num: int, *, vocab_size: int, seed: int,
                  max_position: int = 0, draw: str = 'per_example') -> dict[str, jax.Array]:
  """`num` examples of input length `length`, unpadded (decoder-only layout),
  with randomized positions from [0, max_position) when `max_position` > 0,
  drawn `draw`-wise ('per_example' | 'per_batch')."""
  key = jax.random.fold_in(jax.random.key(seed), length)
  batch = tasks.make_batch(task, key, jnp.full((num,), length, jnp.int32),
                           vocab_size=vocab_size, max_input_length=length)
  if max_position:
    batch = tasks.with_random_positions(batch, jax.random.fold_in(key, 2), max_position, draw)
  return batch


def attention_weights(model: nnx.Module, batch: dict[str, jax.Array]) -> list[np.ndarray]:
  """Per layer, float32 `[B, H, T, T]` attention weights of a `TransformerLM`."""
  _, weights = model(batch['inputs'], positions=batch.get('positions'), return_weights=True)
  return [np.asarray(w) for w in weights]


def attention_entropy(weights) -> np.ndarray:
  """Entropy in nats of each query's weights: `[..., T_q, T_k]` -> `[..., T_q]`."""
  w = np.asarray(weights, np.float64)
  logs = np.log(np.where(w > 0, w, 1.0))
  return -np.sum(w * logs, axis=-1)


def entropy_by_position(model: nnx.Module, batch: dict[str, jax.Array]) -> np.ndarray:
  """Mean entropy over examples, heads and layers, per query position `[T]`."""
  per_layer = [attention_entropy(w).mean(axis=(0, 1)) for w in attention_weights(model, batch)]
  return np.mean(per_layer, axis=0)


def failure_rows(model: nnx.Module, config, lengths) -> list[dict]:
  """How a trained transformer fails on the study's evaluation strings, per
  length of `lengths`: `ambiguity.failure_summary` of its first errors
  (teacher-forced: the same first error as greedy generation), with the
  strings' 3- and 4-gram ceilings for comparison. `config`: the run's
  config or its record (`config.resolved`)."""
  run = resolve(config)
  config = run.config
  strings = evaluation_strings(
      run.task, lengths, train_max=run.bucket_floor,
      num_samples=config.eval.num_samples, vocab_size=config.task.vocab_size,
      eval_seed=config.eval.seed, batch_size=config.eval.batch_size,
      max_position=run.eval_max_position, draw=config.positions.draw)
  rows = []
  for n, s in strings.items():
    predictions = np.asarray(decoder.predict_batch(model, {k: jnp.asarray(v) for k, v in s.items()}))
    errors = ambiguity.first_errors(s['inputs'], s['targets'], s['loss_mask'], predictions,
                                    eos=tasks.EOS)
    ceiling = ambiguity.ceiling(s['inputs'], s['targets'], s['loss_mask'], (3, 4))
    rows.append(dict(length=n, **ambiguity.failure_summary(errors),
                     ceiling_3=ceiling[3], ceiling_4=ceiling[4]))
  return rows
