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
  `prediction_metrics` of `logits` `[B, T, V]`."""
  weight = batch['loss_mask'].astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  metrics = prediction_metrics(jnp.argmax(logits, -1), batch)
  metrics['loss'] = jnp.sum(losses * weight) / jnp.maximum(weight.sum(), 1.0)
  return metrics
