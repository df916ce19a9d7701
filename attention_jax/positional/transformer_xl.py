"""'relative': Transformer-XL's relative attention (Dai et al. 2019), as
Delétang et al. 2023 and Ruoss et al. 2023 use it
(google-deepmind/randomized_positional_encodings, `models/
positional_encodings.py` `compute_attention_with_relative_encodings`).

For query i and key j, with R(p) the sinusoid of relative position p = j - i
(base 10000, all d_model dimensions) and learned per-head vectors u, v:

    score(i, j) = ((q_i + u)·k_j + (q_i + v)·W_r R(j - i)) / √D

where W_r is a bias-free d_model × d_model projection split into heads.
Here q·k/√D is the attention's own score; this encoding adds the rest,
(u·k_j + (q_i + v)·W_r R(j - i)) / √D, as a dense bias, equal to their
bidirectional scores (R over both signs, their `add_negative_side`; tested).
Causal modules use the same R(j - i), the mask hiding j > i (their causal
path, which the benchmark's encoder never takes, shifts a table without the
negative side another way; not followed).

Relative positions come from the call's positions (k_position - q_position),
or from `ScoreContext.distances` (query minus key) when given: Ruoss et al.'s
randomized version samples the distances (`lab/protocols/encoder_layout.py`). Their
noisy code at e8c6474 shifts the sampled indices by +noise_max_length into a
table of noise_max_length rows without its negative side, so half of them
land past the table, where JAX clamps silently; the paper describes sin/cos
of the sampled signed distance, which is what is computed here (any
distance, no table).

Their sin/cos put all sines first; ours interleave (`sinusoidal_at`): a
fixed permutation of R's dimensions, which the i.i.d.-initialised W_r reads
the same in distribution. Parameters at `u`, `v` (`[H, D]`, normal 0.02, as
their `relpos_contentbias`/`relpos_relativebias`) and `W_r`.
"""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.heads import repeat_kv_heads
from attention_jax.attention.scores import DenseBias
from attention_jax.attention.scores import is_arange
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import haiku_truncated_normal
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import KV
from attention_jax.positional.parameters import annotation
from attention_jax.positional.parameters import param
from attention_jax.positional.parameters import scope_param_dtype
from attention_jax.positional.sinusoidal import sinusoidal_at

ORIGIN = "the relative attention of Transformer-XL ('relative')"


class TransformerXL(PositionalEncoding):
  """'relative': content bias u, position bias v, sinusoidal relative keys."""
  reads_distances = True
  per_layer = True  # their layers each hold their own u, v and W_r

  def __init__(self, d_model: int, num_heads: int, causal: bool, *, rngs: nnx.Rngs,
               base: float = 10000.0):
    if d_model % num_heads or d_model % 2:
      raise ValueError(f'relative: d_model={d_model} must be even and divisible by '
                       f'num_heads={num_heads}.')
    self.d_model, self.num_heads, self.causal, self.base = d_model, num_heads, causal, base
    head_dim = d_model // num_heads
    normal = nnx.initializers.normal(0.02)
    self.u = param(normal(rngs.params(), (num_heads, head_dim)), (HEADS, KV))
    self.v = param(normal(rngs.params(), (num_heads, head_dim)), (HEADS, KV))
    # Haiku's Linear default: a truncated normal of stddev 1/sqrt(fan_in).
    self.W_r = nnx.Linear(d_model, d_model, use_bias=False,
                          kernel_init=haiku_truncated_normal(1.0 / np.sqrt(d_model)),
                          param_dtype=scope_param_dtype(),
                          kernel_metadata=annotation((EMBED, HEADS)), rngs=rngs)

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, base=10000.0):
    del max_positions  # any relative position: computed, no table
    return cls(d_model, num_heads, causal, rngs=rngs, base=base)

  def score_contribution(self, context: ScoreContext) -> DenseBias:
    """-> `DenseBias` float32 `[B, H, T_q, T_k]` (module docstring)."""
    q, k = context.q.astype(jnp.float32), context.k.astype(jnp.float32)
    b, t_q, h, d = q.shape
    if h != self.num_heads:
      raise ValueError(f'relative: built for {self.num_heads} heads, got q {q.shape}.')
    k, _ = repeat_kv_heads(k, k, h, q.shape)  # grouped key/value heads: one per query head
    kernel = self.W_r.kernel[...].astype(jnp.float32).reshape(self.d_model, h, d)
    # (q + v)·W_r R = R·z with z = W_r (q + v), per head: no [T, T, H, D] keys.
    u, v = (p[...].astype(jnp.float32) for p in (self.u, self.v))
    z = jnp.einsum('bihd,ehd->bihe', q + v[None, None], kernel)
    t_k = k.shape[1]
    if (context.distances is None and is_arange(context.q_positions)
        and is_arange(context.k_positions)):
      # Token indices: R depends on j - i only, so 2T - 1 sinusoids, not T².
      offsets = np.arange(-(t_q - 1), t_k, dtype=np.int32)
      per_offset = jnp.einsum('bihe,oe->bhio', z, sinusoidal_at(offsets, self.d_model,
                                                                 self.base))
      index = np.arange(t_k)[None, :] - np.arange(t_q)[:, None] + (t_q - 1)
      positional = jnp.take_along_axis(per_offset, jnp.asarray(index)[None, None], axis=-1)
    else:
      relative = -context.distance()  # key minus query: [T_q, T_k] or [B, T_q, T_k]
      features = sinusoidal_at(relative, self.d_model, self.base)  # [(B,) T_q, T_k, d_model]
      subscripts = 'bihe,ije->bhij' if features.ndim == 3 else 'bihe,bije->bhij'
      positional = jnp.einsum(subscripts, z, features)
    content = jnp.einsum('hd,bjhd->bhj', u, k)[:, :, None, :]
    bias = (content + positional) / np.sqrt(d).astype(np.float32)
    return DenseBias(jnp.broadcast_to(bias, (b, h, t_q, t_k)), origin=ORIGIN)
