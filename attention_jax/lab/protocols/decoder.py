"""The decoder protocol: the adapters between the tasks' batch dicts and
the library's array-in, array-out models (what a config says of its model
is `config.facts`, kept in a run's record by `config.resolved`).

The library's models take token arrays; the tasks produce batch dicts in one
of two layouts (`tasks.LAYOUTS`): 'decoder_only' (`inputs`, `targets`,
`loss_mask`, optional `positions`) for `TransformerLM`, 'seq2seq' (`source`,
`source_mask`, `decoder_inputs`, `targets`, `loss_mask`) for `Seq2Seq`. The
functions here are the only place that knows both.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.nn.seq2seq import Seq2Seq
from attention_jax.nn.transformer import TransformerLM
from attention_jax.nn.decoding import greedy_predictions


def batch_layout(model: nnx.Module) -> str:
  """The `tasks.LAYOUTS` key of the batches `model` reads."""
  if isinstance(model, Seq2Seq):
    return 'seq2seq'
  if isinstance(model, TransformerLM):
    return 'decoder_only'
  raise TypeError(f'no batch layout for a {type(model).__name__}; '
                  'expected a TransformerLM or a Seq2Seq.')


def forward_batch(model: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
  """Teacher-forced logits `[B, T, V]` aligned with `batch['targets']` (at
  `batch['positions']` when the batch has them: randomized positions; each
  example by itself when it has `segment_ids`: packed rows)."""
  if isinstance(model, Seq2Seq):
    return model(batch['source'], batch['source_mask'], batch['decoder_inputs'])
  if 'abacus_offset' in batch:  # training batches of an Abacus model: its k
    return model(batch['inputs'], positions=batch.get('positions'),
                 abacus_offset=batch['abacus_offset'])
  if 'segment_ids' in batch:  # positions restart per example unless the batch has its own
    return model(batch['inputs'], positions=batch.get('positions'),
                 segment_ids=batch['segment_ids'])
  return model(batch['inputs'], positions=batch.get('positions'))


def predict_batch(model: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
  """int32 predictions aligned with `batch['targets']`: the transformer's
  teacher-forced argmax, a seq2seq model's greedy decoding."""
  if isinstance(model, Seq2Seq):
    return model.greedy_decode(batch['source'], batch['source_mask'],
                               batch['targets'].shape[1])
  return jnp.argmax(forward_batch(model, batch), -1).astype(jnp.int32)


def generate_batch(model: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
  """Greedy autoregressive predictions aligned with `batch['targets']`: the
  prompt (up to the first output token) is read, then every token is the
  model's own previous prediction (with the key/value cache for the
  transformer; a seq2seq model's `predict_batch` already decodes greedily)."""
  if isinstance(model, Seq2Seq):
    return predict_batch(model, batch)
  mask = batch['loss_mask']
  prompt_lengths = jnp.argmax(mask, axis=1) + 1
  # Decoding ends after the last scored position of the longest row (EOS):
  # the padding of a bucket is never decoded.
  stop = jnp.max(mask.shape[1] - jnp.argmax(mask[:, ::-1], axis=1))
  return greedy_predictions(model, batch['inputs'], prompt_lengths, batch.get('positions'),
                            stop=stop)
