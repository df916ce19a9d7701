"""`AdditiveAttention`: Bahdanau attention (or Luong's dot score) as an NNX module."""

from typing import Optional

import jax.numpy as jnp
from flax import nnx

from attention_jax.attention.checks import check_count
from attention_jax.nn.arguments import check_constructor
from attention_jax.attention import additive_scores
from attention_jax.attention import attend
from attention_jax.attention import dot_scores
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import MLP
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import check_dtypes
from attention_jax.positional.parameters import param

SCORES = ('additive', 'dot')


class AdditiveAttention(nnx.Module):
  """Context vector over encoder states for one decoder state per example.

  Args:
    query_dim: width of the decoder state s.
    key_dim: width of the encoder states h (also the context's width).
    attention_dim: width A of `W s + U h` (additive score only).
    score: 'additive' (vᵀ tanh(W s + U h), Bahdanau) or 'dot' (sᵀ h, Luong;
      needs query_dim == key_dim and has no parameters).
    dtype: computation dtype of the projections W s and U h (Flax's: None
      infers it from the inputs and parameters); tanh, the scores and the
      softmax are float32 whatever it is, the context in the keys' dtype.
    param_dtype: storage of W, U and v; default float32.
    rngs: `nnx.Rngs` for the parameters.
  """

  def __init__(self, query_dim: int, key_dim: int, attention_dim: int = 0, *,
               score: str = 'additive', dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    check_constructor('AdditiveAttention', rngs=rngs,
                      counts=(('query_dim', query_dim), ('key_dim', key_dim)))
    check_count('AdditiveAttention', 'attention_dim (0: key_dim)', attention_dim, minimum=0)
    dtype, param_dtype = check_dtypes('AdditiveAttention', dtype, param_dtype)
    if score not in SCORES:
      raise ValueError(f'score={score!r}; choose one of {SCORES}.')
    if score == 'dot' and query_dim != key_dim:
      raise ValueError(
          f"score='dot' needs query_dim == key_dim, got {query_dim} and {key_dim}.")
    self.score, self.dtype, self.param_dtype = score, dtype, param_dtype
    if score == 'additive':
      attention_dim = attention_dim or key_dim
      proj = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                  kernel_metadata=annotation((EMBED, MLP)), bias_metadata=annotation((MLP,)))
      self.W = nnx.Linear(query_dim, attention_dim, use_bias=False, **proj)
      self.U = nnx.Linear(key_dim, attention_dim, use_bias=True, **proj)
      self.v = param(nnx.initializers.lecun_normal()(
          rngs.params(), (attention_dim, 1))[:, 0], (MLP,), param_dtype)

  def project_keys(self, keys: jnp.ndarray) -> Optional[jnp.ndarray]:
    """`U h` for encoder states `[..., T, key_dim]`, computed once per sequence
    (None for the dot score)."""
    return self.U(keys) if self.score == 'additive' else None

  def __call__(self, query: jnp.ndarray, keys: jnp.ndarray, *,
               mask: Optional[jnp.ndarray] = None,
               keys_proj: Optional[jnp.ndarray] = None):
    """query `[..., query_dim]`, keys `[..., T, key_dim]`, mask bool `[..., T]`
    (True = real position), keys_proj from `project_keys` (optional) ->
    `(context [..., key_dim], weights float32 [..., T])`."""
    if self.score == 'dot':
      scores = dot_scores(query, keys)
    else:
      if keys_proj is None:
        keys_proj = self.project_keys(keys)
      scores = additive_scores(self.W(query), keys_proj, self.v[...])
    return attend(scores, keys, mask)
