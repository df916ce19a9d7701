"""The metric math shared by training and evaluation: loss, token accuracy
and exact match over a batch's output tokens (`batch['loss_mask']`)."""

import jax
import jax.numpy as jnp
import optax


def prediction_metrics(predictions: jax.Array, batch: dict[str, jax.Array],
                       per_example: bool = False) -> dict[str, jax.Array]:
  """Accuracies of int `predictions` `[B, T]` over the output tokens
  (`batch['loss_mask']`): token_accuracy, and exact_match, the fraction of
  sequences with every output token right (under teacher forcing the same as
  greedy decoding getting it all right). `per_example`: instead, `exact`,
  bool `[B]`, whether each sequence is entirely right."""
  mask = batch['loss_mask']
  num_tokens = jnp.maximum(mask.sum().astype(jnp.float32), 1.0)
  correct = (predictions == batch['targets']) | ~mask
  if per_example:
    return dict(exact=jnp.all(correct, axis=-1))
  return dict(
      token_accuracy=jnp.sum((correct & mask).astype(jnp.float32)) / num_tokens,
      exact_match=jnp.mean(jnp.all(correct, axis=-1).astype(jnp.float32)),
  )


def masked_metrics(logits: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Loss (mean cross-entropy per output token) and the teacher-forced
  `prediction_metrics` of `logits` `[B, T, V]`; a batch of packed rows
  (`segment_ids`, `tasks/packed_rows.py`) has exact_match per example and
  `examples`, the examples it holds."""
  weight = batch['loss_mask'].astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  predictions = jnp.argmax(logits, -1)
  metrics = prediction_metrics(predictions, batch)
  if 'segment_ids' in batch:
    metrics['exact_match'], metrics['examples'] = segment_exact_match(predictions, batch)
  metrics['loss'] = jnp.sum(losses * weight) / jnp.maximum(weight.sum(), 1.0)
  return metrics


def segment_exact_match(predictions: jax.Array, batch: dict[str, jax.Array]
                        ) -> tuple[jax.Array, jax.Array]:
  """(fraction of examples with every output token right, examples) over
  the segments of packed rows: `batch['segment_ids']` int `[B, T]`, an
  example = a (row, id) pair with an output token."""
  mask, ids = batch['loss_mask'], batch['segment_ids']
  b, t = ids.shape
  # One bucket per (row, id); ids of a row are below T (one token each at most).
  bucket = (jnp.arange(b, dtype=jnp.int32)[:, None] * t + jnp.clip(ids, 0, t - 1)).reshape(-1)
  scored = jax.ops.segment_max(mask.reshape(-1).astype(jnp.int32), bucket, b * t) > 0
  wrong = jax.ops.segment_max((mask & (predictions != batch['targets'])).reshape(-1)
                              .astype(jnp.int32), bucket, b * t) > 0
  examples = jnp.sum(scored.astype(jnp.float32))
  return jnp.sum((scored & ~wrong).astype(jnp.float32)) / jnp.maximum(examples, 1.0), examples
