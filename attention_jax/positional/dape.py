"""DAPE, data-adaptive positional encoding (Zheng et al., NeurIPS 2024).

"DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", arXiv
2405.14722. A relative bias B (KERPLE or ALiBi) is corrected, at every
query/key pair, by a small MLP that sees the attention scores and the biases
of *all* heads there. For query i, key j (s, B, f over the head axis):

    s_ij   = q_i · k_j / √D                                `[H]`, every head
    B_ij   = the base bias at (i, j)                        `[H]`
    f(s, B)_ij = W₂ · LeakyReLU(W₁ · [s_ij ; B_ij] + b₁) + b₂  2H → W → H
    logits_ij = s_ij + B_ij + f(s, B)_ij

* Base biases: 'kerple' (log variant) `-p_h · log(1 + a_h · |i − j|)`, p, a
  learned per head (`kerple.kerple_log_bias`); 'alibi' `-m_h · (i − j)`,
  slopes fixed (`alibi.alibi_bias_at`).
* f: Linear(2H, W) → LeakyReLU (slope 0.01) → Linear(W, H), the same weights
  at every (i, j); the first H inputs are the scores, the next H the bias.

Here DAPE is `score_contribution`: it reads the call's q `[B, T_q, H, D]` and
k `[B, T_k, H_kv, D]` (key/value heads repeated for grouped queries) and
returns `DenseBias(B + f(s, B))`, float32 `[B, H, T_q, T_k]`. The kernels add
a bias after scaling q·k by 1/√D, so their logits are s + B + f(s, B): the
code's. The MLP sees s in float32 whatever the dtype of q and k. Entries the
call masks (`ScoreContext.visible()`: causal on slots, window, padding, the
caller's mask) enter the MLP as s = B = 0 and leave it as 0: f is applied per
(i, j), so they could not reach a visible entry anyway, but padded or unwritten
cache keys cannot bring a NaN in, and the gradient sees only what attention
uses. Cached decoding (k the whole cache, queries at their slots) therefore
gives the bias of the full pass.

Cost. DAPE is O(T²) by nature: q·k on every pair (computed here as well as in
the kernel) and a 2H → W → H MLP on each, O(B · T_q · T_k · H · W) work and
a `[B, T_q, T_k, W]` float32 hidden layer. It runs on the dense kernel; the
chunked kernel refuses a `DenseBias` (its error names 'the data-adaptive bias
of dape') and implementation='auto' picks the dense kernel.

Matching the official code. github.com/chuanyang-Zheng/DAPE,
megatron/model/positional_embeddings.py, classes `ParallelKerpleLog_C`
(pos_emb='kerple_c') and `AliBi_C` ('alibi_c'), commit 5667d281, called from
megatron/model/transformer.py `ParallelSelfAttention.attention` on
`attention_scores` = baddbmm(q, kᵀ, alpha=1/norm_factor) before the mask and
softmax; DAPE.py (commit dbe2889f: `ParallelKerpleLog_DAPE`, `AliBi_DAPE`)
has the same forwards. tests/positional/test_dape.py transcribes them and matches.

* Residual form: the code returns x + bias + mlp2(cat(x, bias)), i.e.
  s + B + f(s, B), B kept outside f. Ours: the same.
* Scaling: the MLP sees the scores already divided by norm_factor = √D
  (`apply_query_key_layer_scaling` is off by default, and `use_mup` too).
  Ours: q·k/√D.
* Masking: the code feeds the unmasked scores (future keys included) and the
  base bias with tril(i − j), 0 above the diagonal, to the MLP, and masks
  afterwards (`scale_mask_softmax`). Ours zeroes both at masked entries:
  the same at every visible entry (the MLP is per entry).
* MLP: the code's `mlp2` = Linear(2H, mlp_width) → LeakyReLU() → Linear(mlp_width,
  H), both with biases, PyTorch's default init (uniform ±1/√fan_in), width 32
  in every DAPE config. Ours: the same, `mlp_width=32`.
* Base bias: the code has no default; 'kerple_c', 'alibi_c' and 'fire_c'
  are separate pos_emb values, one config each (configs/125M/512/). Ours:
  `base='kerple'` by choice (KERPLE is learned, ALiBi fixed), or 'alibi'.
* KERPLE's p, a: the code draws p ~ U(0, 2), a ~ U(0, 1) per head and clamps
  both in place to >= 1e-2 at every forward (so the forward sees max(·, 1e-2)
  and the gradient reaches the raw parameter). Ours: the same init, and
  max(·, 1e-2) in the forward with a straight-through gradient.
  (Our 'kerple' encoding uses softplus and starts at 1; DAPE follows its code.)
* Distances: the code's tril(i − j) is 0 for keys after the query (masked);
  ours |i − j| (KERPLE) and i − j (ALiBi) from the *positions*, so explicit
  or cached positions get the same bias.
* Layers: the code builds one module (MLP and KERPLE parameters) per
  attention layer; `per_layer = True` here (`encoding_per_layer=False`
  shares them).
* Precision: the code runs in the model's fp16; ours float32 throughout.
* Not ported: 'fire_c' (its FIRE's inner MLP uses LeakyReLU, ours ReLU),
  'nope_c' (an MLP on the scores alone) and DAPE V2's `*_dapev2` (1 × k
  convolutions over the key axis instead of the per-entry MLP).

Bidirectional attention (`causal=False`, not in the paper, whose models are
causal LMs) uses the base biases' symmetric forms (|i − j|) and the same MLP.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.heads import repeat_kv_heads
from attention_jax.attention.scores import DenseBias
from attention_jax.positional.alibi import alibi_bias_at
from attention_jax.positional.alibi import alibi_slopes
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import torch_linear_init
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.kerple import kerple_log_bias
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import param

ORIGIN = 'the data-adaptive bias of dape (O(T²) by nature: an MLP on every q·k)'
BASES = ('kerple', 'alibi')
KERPLE_FLOOR = 1e-2  # the code's in-place clamp of p and a (its `eps`)

# HIGHEST: f32 products on every backend (GPUs would otherwise use TF32).
_HIGHEST = jax.lax.Precision.HIGHEST


def dape_scores(q: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
  """The scaled scores the MLP reads, `q · k / √D`.

  Args:
    q: queries `[B, T_q, H, D]`.
    k: keys `[B, T_k, H_kv, D]`, H_kv dividing H (repeated for grouped queries).

  Returns:
    float32 `[B, H, T_q, T_k]`.
  """
  k, _ = repeat_kv_heads(k, k, q.shape[2], q.shape)
  q = jnp.asarray(q, jnp.float32)
  k = jnp.asarray(k, jnp.float32)
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k, precision=_HIGHEST)
  return scores / np.float32(math.sqrt(q.shape[-1]))


def dape_bias(scores: jnp.ndarray, base_bias: jnp.ndarray, w1: jnp.ndarray,
              b1: jnp.ndarray, w2: jnp.ndarray, b2: jnp.ndarray,
              visible=None) -> jnp.ndarray:
  """`B + f(s, B)`: what DAPE adds to the scaled scores s.

  Args:
    scores: s = q·k/√D, float `[B, H, T_q, T_k]`.
    base_bias: B, float `[B|1, H, T_q, T_k]`.
    w1: float `[2H, W]` (kernel `[in, out]`: rows 0 … H-1 read s, rows H …
      2H-1 read B, the code's cat order), b1 `[W]`.
    w2: float `[W, H]`, b2 `[H]`: one output per head.
    visible: bool broadcastable to `[B, H, T_q, T_k]`, True where the query
      attends; None = everywhere. Elsewhere s and B enter as 0 and the result
      is 0.

  Returns:
    float32 `[B, H, T_q, T_k]`.
  """
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  scores, base_bias = f32(scores), f32(base_bias)
  base_bias = jnp.broadcast_to(base_bias, scores.shape)
  if visible is not None:
    scores = jnp.where(visible, scores, 0.0)
    base_bias = jnp.where(visible, base_bias, 0.0)
  features = jnp.concatenate([scores, base_bias], axis=1)  # [B, 2H, T_q, T_k]
  hidden = jnp.einsum('bcqk,cw->bqkw', features, f32(w1), precision=_HIGHEST) + f32(b1)
  hidden = jax.nn.leaky_relu(hidden, negative_slope=0.01)  # torch's LeakyReLU default
  correction = jnp.einsum('bqkw,wh->bhqk', hidden, f32(w2), precision=_HIGHEST)
  bias = base_bias + correction + f32(b2)[:, None, None]
  if visible is not None:
    bias = jnp.where(visible, bias, 0.0)
  return bias


def _floor_straight_through(x: jnp.ndarray, floor: float) -> jnp.ndarray:
  """max(x, floor) forward, identity backward: the code's in-place clamp
  before each forward, which leaves the gradient to the parameter itself."""
  return x + jax.lax.stop_gradient(jnp.maximum(x, floor) - x)


def _check_options(base, mlp_width, rngs) -> None:
  if not isinstance(base, str) or base not in BASES:
    raise ValueError(f'dape: base={base!r} must be one of {list(BASES)}.')
  if (isinstance(mlp_width, bool) or not isinstance(mlp_width, (int, np.integer))
      or mlp_width < 1):
    raise ValueError(f'dape: mlp_width={mlp_width!r} must be an integer >= 1.')
  if rngs is None:
    raise ValueError('dape: needs rngs (nnx.Rngs) to initialise its MLP.')


class DAPE(PositionalEncoding):
  """'dape': a base bias B (KERPLE or ALiBi) plus an MLP of (q·k/√D, B) over heads."""

  per_layer = True  # the official code builds one per attention layer

  def __init__(self, num_heads: int, *, rngs: nnx.Rngs, base: str = 'kerple',
               mlp_width: int = 32, causal: bool = True):
    self.num_heads = num_heads
    self.base = base  # static: which bias the graph computes
    self.causal = causal  # static: ALiBi's bias differs (symmetric when False)
    if base == 'alibi':
      # Static Python floats, as in `ALiBi`: constants, not parameters.
      self.slopes = tuple(float(s) for s in alibi_slopes(num_heads))
    else:
      # The code's init: p = 2·U(0, 1), a = U(0, 1) per head.
      self.kerple_p = param(2.0 * jax.random.uniform(rngs.params(), (num_heads,)), (HEADS,))
      self.kerple_a = param(jax.random.uniform(rngs.params(), (num_heads,)), (HEADS,))
    fan_in = 2 * num_heads
    # The MLP's few hidden units are replicated: only its heads' outputs split.
    init = lambda fan_in, shape, axes: param(torch_linear_init(rngs.params(), fan_in, shape),
                                             axes)
    self.w1 = init(fan_in, (fan_in, mlp_width), (None, None))
    self.b1 = init(fan_in, (mlp_width,), (None,))
    self.w2 = init(mlp_width, (mlp_width, num_heads), (None, HEADS))
    self.b2 = init(mlp_width, (num_heads,), (HEADS,))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, base: str = 'kerple',
            mlp_width: int = 32):
    """Options: `base` ('kerple' or 'alibi', the bias B the MLP corrects;
    default 'kerple') and `mlp_width` W (hidden units of the MLP, >= 1;
    default 32, the official configs')."""
    del d_model, max_positions  # defined at every length
    _check_options(base, mlp_width, rngs)
    return cls(num_heads, rngs=rngs, base=base, mlp_width=int(mlp_width), causal=causal)

  def kerple_parameters(self) -> tuple[jnp.ndarray, jnp.ndarray]:
    """KERPLE's (p, a) as the forward uses them, float32 `[H]` each, >= 1e-2."""
    f32 = lambda a: a[...].astype(jnp.float32)
    return (_floor_straight_through(f32(self.kerple_p), KERPLE_FLOOR),
            _floor_straight_through(f32(self.kerple_a), KERPLE_FLOOR))

  def base_bias(self, q_positions, k_positions) -> jnp.ndarray:
    """B from integer positions `[T]` or `[B, T]` -> float32 `[1|B, H, T_q, T_k]`."""
    if self.base == 'alibi':
      return heads_rank4(alibi_bias_at(self.slopes, q_positions, k_positions, self.causal))
    p, a = self.kerple_parameters()
    return heads_rank4(kerple_log_bias(p, a, q_positions, k_positions))

  def score_contribution(self, context: ScoreContext) -> DenseBias:
    """-> `DenseBias` float32 `[B, H, T_q, T_k]`: B + f(q·k/√D, B), 0 where masked."""
    if context.q.shape[2] != self.num_heads:
      raise ValueError(f'dape: built for {self.num_heads} heads, but q {context.q.shape} '
                       f'[B, T_q, H, D] has {context.q.shape[2]}.')
    scores = dape_scores(context.q, context.k)
    bias = dape_bias(scores, self.base_bias(context.q_positions, context.k_positions),
                     self.w1[...], self.b1[...], self.w2[...], self.b2[...],
                     context.visible())
    return DenseBias(bias, origin=ORIGIN)
