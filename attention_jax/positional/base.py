"""The interface every positional encoding implements: three optional hooks.

An encoding contributes to a transformer in at most three places, so the
attention code never needs to ask which encoding it is:

* `add_to_embeddings` — absolute encodings (sinusoidal, learned) add a vector
  to each token embedding before the first block (`TransformerLM` calls it;
  attention modules refuse an encoding that has only this hook);
* `rotate_queries_keys` — RoPE rotates q and k inside every attention layer;
* `score_bias` — relative encodings (ALiBi, T5, KERPLE) add to the attention
  scores, described as a spec (`attention.scores`: `NoBias`, `LinearBias`,
  `DenseBias`) so that each attention kernel builds it its own way. Its
  default wraps `attention_bias`, the dense bias, as a `DenseBias`: a subclass
  may implement either.

Positions are integer arrays `[T]` (shared by the batch) or `[B, T]`. Modules
default them to `np.arange(T)`: a static array, so length checks happen at
trace time even under `jax.jit`, and linear biases can be recognised.
"""

from typing import Optional

import jax.numpy as jnp
from flax import nnx

from attention_jax.attention.scores import DenseBias
from attention_jax.attention.scores import NoBias
from attention_jax.attention.scores import ScoreBias


def heads_rank4(bias: jnp.ndarray) -> jnp.ndarray:
  """A per-head bias `[H, T_q, T_k]` (positions `[T]`) or `[B, H, T_q, T_k]`
  (positions `[B, T]`) -> rank 4 `[1|B, H, T_q, T_k]`."""
  return bias[None] if bias.ndim == 3 else bias


class PositionalEncoding(nnx.Module):
  """Base class; each hook defaults to "no contribution". Also 'none' (NoPE).

  A subclass registered by name (`register_encoding`) also has a `build`
  classmethod taking `d_model, num_heads, max_positions, causal, rngs` and its
  own keyword options.
  """

  def add_to_embeddings(self, x: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
    """x `[B, T, D]`, positions `[T]` or `[B, T]` -> `[B, T, D]`."""
    del positions
    return x

  def rotate_queries_keys(
      self, q: jnp.ndarray, k: jnp.ndarray, q_positions: jnp.ndarray,
      k_positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """q `[B, T_q, H, D]`, k `[B, T_k, H, D]` -> rotated (q, k), same shapes."""
    del q_positions, k_positions
    return q, k

  def attention_bias(
      self, q_positions: jnp.ndarray, k_positions: jnp.ndarray) -> Optional[jnp.ndarray]:
    """-> float32 bias `[1|B, H, T_q, T_k]` (B when positions are `[B, T]`), or
    None. (A rank-3 `[H, T_q, T_k]` from a subclass is read as one per head.)"""
    del q_positions, k_positions
    return None

  def score_bias(self, q_positions: jnp.ndarray, k_positions: jnp.ndarray) -> ScoreBias:
    """The contribution to the scores as a spec; by default `attention_bias`
    as a `DenseBias` (or `NoBias()` when it is None). Override it to return
    a cheaper spec, e.g. `LinearBias(slopes)` (see `ALiBi`)."""
    bias = self.attention_bias(q_positions, k_positions)
    if bias is None:
      return NoBias()
    return DenseBias(heads_rank4(jnp.asarray(bias, jnp.float32)),
                     origin=f'the bias of {type(self).__name__}, which is not linear in i - j')

  @property
  def acts_in_attention(self) -> bool:
    """Whether it rotates q/k or adds to the scores inside attention."""
    return bool(hooks_of(type(self)) & ATTENTION_HOOKS)


HOOKS = ('add_to_embeddings', 'rotate_queries_keys', 'attention_bias', 'score_bias')
ATTENTION_HOOKS = frozenset(HOOKS[1:])


def hooks_of(cls: type) -> frozenset:
  """The hooks an encoding class implements (overrides), by name."""
  return frozenset(h for h in HOOKS
                   if getattr(cls, h) is not getattr(PositionalEncoding, h))


def embedding_only(cls: type) -> bool:
  """Whether an encoding class only adds to the embeddings (sinusoidal,
  learned): attention modules refuse it, models add it to the embeddings."""
  hooks = hooks_of(cls)
  return 'add_to_embeddings' in hooks and not hooks & ATTENTION_HOOKS


class NoPE(PositionalEncoding):
  """'none': no positional information at all (a causal mask still breaks
  permutation symmetry; Kazemnejad et al. 2023 find it extrapolates well)."""

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
    del d_model, num_heads, max_positions, causal, rngs
    return cls()
