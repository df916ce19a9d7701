"""Bahdanau attention weights of a trained seq2seq model on one example."""

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.lab import tasks


def seq2seq_alignment(model, task: tasks.DecoderTask, length: int, *, vocab_size: int,
                      seed: int = 0) -> dict[str, np.ndarray]:
  """Greedy-decodes one example of input length `length` and returns
  `weights` `[m + 1, length]` (decoder step × encoder position, over the real
  tokens only), `source` `[length]`, `prediction` and `target` `[m + 1]`.

  Raises:
    ValueError: if `model` has no attention (e.g. a plain `seq2seq`).
  """
  if getattr(model, 'attention', None) is None:
    raise ValueError('seq2seq_alignment needs a model with attention '
                     "(model.kind='seq2seq_attention').")
  batch = tasks.make_seq2seq_batch(
      task, jax.random.key(seed), jnp.array([length], jnp.int32),
      vocab_size=vocab_size, max_input_length=length)
  steps = batch['targets'].shape[1]
  prediction, weights = model.greedy_decode(
      batch['source'], batch['source_mask'], steps, return_weights=True)
  return dict(weights=np.asarray(weights[0]), source=np.asarray(batch['source'][0]),
              prediction=np.asarray(prediction[0]), target=np.asarray(batch['targets'][0]))
