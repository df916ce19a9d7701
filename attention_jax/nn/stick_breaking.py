"""The learned part of stick-breaking's `remainder='head_bias'`: what the
authors' model code adds to the attention output (`attention.stick_breaking`).

IBM/dolomite-engine (now lm_engine), class `SBAttention`, commit d0ee1861:

    hidden, rem = sb_attn(q, k, v)                  # Σ_j A_ij v_j, 1 - Σ_j A_ij
    hidden = hidden + rem[..., None] * head_bias    # head_bias [H, D], zeros at the start
    hidden = GroupNorm(num_heads, hidden_size)(hidden viewed [B·T, H·D])
    out = c_proj(hidden)

`MultiHeadAttention` with `normalization=StickBreaking(remainder='head_bias')`
holds a `HeadBiasRemainder` as `remainder` (parameters `remainder.head_bias`
`[H, D]` and `remainder.norm.scale` / `remainder.norm.bias` `[H·D]`; the
torch GroupNorm's weight and bias) and runs every kernel that serves
stick-breaking: the kernels add no remainder term then, and the values carry
one extra channel of ones, whose output is Σ_j A_ij, so r_i = 1 - Σ_j A_ij
comes out of any kernel, blockwise ones included, with no weights formed.
"""

import jax.numpy as jnp
from flax import nnx

from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import KV
from attention_jax.positional.parameters import NORM
from attention_jax.positional.parameters import annotate
from attention_jax.positional.parameters import param

# torch.nn.GroupNorm's default, which SBAttention keeps.
GROUP_NORM_EPSILON = 1e-5


class HeadBiasRemainder(nnx.Module):
  """r_i · b_h added to each head's output, then a GroupNorm per head.

  Args:
    num_heads, head_dim: the attention's H and D.
    dtype, param_dtype: computation and parameter dtypes (the module's).
    rngs: unused by the initialisers (zeros, ones), required by `nnx.GroupNorm`.
  """

  def __init__(self, num_heads: int, head_dim: int, *, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.num_heads, self.head_dim = num_heads, head_dim
    self.head_bias = param(jnp.zeros((num_heads, head_dim)), (HEADS, KV), param_dtype)
    # Groups = heads over the H·D channels laid out head-major, as the torch
    # view [B·T, hidden_size] of [B, T, H, D] is; the exact (two-pass)
    # variance, as torch computes it.
    self.norm = nnx.GroupNorm(num_heads * head_dim, num_groups=num_heads,
                              epsilon=GROUP_NORM_EPSILON, dtype=dtype,
                              param_dtype=param_dtype, use_fast_variance=False, rngs=rngs)
    for variable in (self.norm.scale, self.norm.bias):  # GroupNorm takes no metadata
      annotate(variable, (NORM,))

  @staticmethod
  def values(v: jnp.ndarray) -> jnp.ndarray:
    """v `[B, T_k, H_kv, D]` -> `[B, T_k, H_kv, D + 1]`: a last channel of
    ones, whose attention output is Σ_j A_ij (the kernels add no remainder
    term with 'head_bias')."""
    return jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)

  def __call__(self, out: jnp.ndarray) -> jnp.ndarray:
    """out `[B, T_q, H, D + 1]` (attention over `values(v)`) -> `[B, T_q, H,
    D]`: GroupNorm(Σ_j A_ij v_j + (1 - Σ_j A_ij) b_h), in out's dtype."""
    out, mass = out[..., :-1], out[..., -1:]
    b, t, h, d = out.shape
    if (h, d) != (self.num_heads, self.head_dim):
      raise ValueError(f'HeadBiasRemainder was built for {self.num_heads} heads of '
                       f'{self.head_dim} channels, got an output {out.shape} [B, T, H, D].')
    hidden = (out.astype(jnp.float32) + (1.0 - mass.astype(jnp.float32))
              * self.head_bias[...].astype(jnp.float32))
    hidden = self.norm(hidden.reshape(b * t, h * d).astype(out.dtype))
    return hidden.reshape(b, t, h, d).astype(out.dtype)
