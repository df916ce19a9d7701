"""Dropout on the attention weights: what `MultiHeadAttention` computes
while dropping (`dropout_rate > 0`, not deterministic), from the weights the
dense kernel formed."""

import jax.numpy as jnp
from flax import nnx

from attention_jax.attention.heads import repeat_kv_heads


def dropped_values(weights, k, v, rate: float, broadcast: bool, rngs):
  """dropout(weights) · v: weights `[B, H, T_q, T_k]`, k `[B, T_k, H_kv, D]`,
  v `[B, T_k, H_kv, D_v]` -> `[B, T_q, H, D_v]` in v's dtype, with the dense
  kernel's float32 sums. One dropout mask shared over batch and heads with
  `broadcast` (Flax's default). Unlike `scaled_dot_product_attention`, the
  values are multiplied as given: a NaN in a masked key's value reaches the
  outputs here (0 · NaN)."""
  if rngs is None:
    raise ValueError('dropout needs random keys: build the module with rngs=nnx.Rngs(...) '
                     'or pass rngs= to the call.')
  dims = (0, 1) if broadcast else ()
  dropped = nnx.Dropout(rate, broadcast_dims=dims)(weights, deterministic=False, rngs=rngs)
  _, v = repeat_kv_heads(k, v, weights.shape[1])
  out = jnp.einsum('bhqk,bkhd->bqhd', dropped, v, preferred_element_type=jnp.float32)
  return out.astype(v.dtype)
