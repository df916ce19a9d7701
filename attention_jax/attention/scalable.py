"""Scalable softmax (SSMax; Nakanishi 2025, arXiv 2501.19399; the log-length
scaling of Chiang & Cholak 2022): a query that may see n keys has its logits
multiplied by `s_h · log(n)`, with s_h learned per head, so that attention
does not flatten out as n grows past the lengths seen in training.

Here the factor multiplies the query (q ← s_h · log(n_i) · q), which scales
the content logits q·k/√d exactly and works with every kernel unchanged; an
encoding's additive bias (ALiBi, T5, …) is left as it is, so the bias keeps
its trained meaning. With n = 1 the factor is 0: a query with one key to see
attends to it whatever the logits.
"""

from typing import Optional

import jax.numpy as jnp


def visible_keys(query_index: jnp.ndarray, num_keys: int, *, causal: bool,
                 window: Optional[int] = None,
                 kv_lengths: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """Keys each query may attend to: int32 `[T_q]` (`[B, T_q]` with
  `kv_lengths` `[B]`), from query token indices `[T_q]` (or `[B, T_q]`),
  `num_keys` keys, the causal mask and a sliding `window` (|i - j| < window),
  as `scaled_dot_product_attention` applies them."""
  i = jnp.asarray(query_index, jnp.int32)
  length = jnp.int32(num_keys)
  if kv_lengths is not None:
    length = jnp.minimum(length, jnp.asarray(kv_lengths, jnp.int32)[:, None])
  last = jnp.minimum(i, length - 1) if causal else length - 1  # last visible key
  first = jnp.zeros_like(i)
  if window is not None:
    first = jnp.maximum(first, i - window + 1)
    last = jnp.minimum(last, i + window - 1)
  return jnp.maximum(last - first + 1, 0)


def scalable_softmax_queries(q: jnp.ndarray, scale: jnp.ndarray,
                             num_visible: jnp.ndarray) -> jnp.ndarray:
  """q `[B, T_q, H, D]` times `scale_h · log(n)`: scale `[H]`, num_visible
  `[T_q]` or `[B, T_q]` -> `[B, T_q, H, D]` in q's dtype (the factor in
  float32)."""
  n = jnp.maximum(jnp.asarray(num_visible, jnp.float32), 1.0)
  factor = jnp.log(n)[..., :, None] * jnp.asarray(scale, jnp.float32)  # [..., T_q, H]
  return (q.astype(jnp.float32) * factor[..., None]).astype(q.dtype)
