"""FIRE, functional interpolation for relative positions (Li et al., ICLR 2024).

"Functional Interpolation for Relative Positions Improves Long Context
Transformers", arXiv 2310.04418. Head h adds a learned function of the
*normalised* distance to the score of query i for key j:

    bias[h, i, j] = f_θ( ψ(i − j) / (ψ(max(L, i)) + eps) )[h]
    ψ(x) = log(|c · x| + 1)

* f_θ: an MLP 1 → `mlp_width` (ReLU) → H: one scalar goes in, one bias per
  head comes out.
* c: a learned scalar (start `init_c`); the log makes nearby distances
  differ more than far ones.
* L = |s · L₀|: a threshold with L₀ = `init_threshold` fixed and the scale s
  learned from 1. Queries at i < L are normalised by ψ(L), a constant, so for
  short contexts the bias is a function of the distance alone; from i >= L on
  the input is ψ(i − j)/ψ(i) in [0, 1] whatever the length ("progressive
  interpolation": a query at position 10 000 sees its keys on the same [0, 1]
  scale as a query at 1 000).

i and j are the *positions* (q_positions, k_positions), not the matrix
indices, so explicit positions, randomized positions and cached decoding all
see the same bias. The bias is finite everywhere: keys after the query
(i − j < 0, hidden by the causal mask) get the value at |i − j| (the |·| in ψ),
never the log of a negative number. Float32 `[H, T_q, T_k]` for positions
`[T]`, `[B, H, T_q, T_k]` for `[B, T]`, whatever the model's dtype.

Matching the reference code. There is no official repository; the reference
is the port users run, github.com/mcleish7/arithmetic,
cramming/architectures/embeddings.py, class `FIRE` (commit 55af9d5e), whose
forward tests/positional/test_fire.py transcribes and matches. Where the paper's formula
b(i, j) = f_θ(ψ(i − j)/ψ(max{L, i})), ψ(x) = log(cx + 1), and that code
differ, we follow the code:

* |·| in ψ: the paper writes log(c·x + 1) with c > 0 and i − j >= 0; the code
  takes log(|c·x| + 1), so c < 0 acts as |c| and i − j < 0 stays finite.
  Ours: the code's, computed as log1p(|c·x|) (the same value, more accurate
  when c·x is small).
* L: the paper's text learns L itself; the code keeps init_L = 512 frozen
  (`requires_grad=False`) and learns a multiplier from 1.0, L = |m · init_L|
  (so an optimizer step moves L in proportion to its size, and a negative m
  acts as |m|). Ours: the same (`threshold_scale`, `init_threshold`).
* eps: the code divides by ψ(max(L, i)) + eps, eps = 1e-6 (the formula has
  none; it only matters when c · max(L, i) is near 0). Ours: the same (`eps`).
* Initial values: the code's c = 0.1, init_L = 512, MLP width 32 are our
  defaults. The MLP is the code's Linear(1, W) → ReLU → Linear(W, H), both
  with biases, initialised as PyTorch's `Linear` is (weights and biases
  uniform in ±1/√fan_in); the paper's formula only says f_θ is an MLP.
* The normaliser is max(L, i) with i the query's position, in both.
* Positions: the code's forward draws its own: in training with
  `max_length > T` a sorted random subset of 0 … max_length − 1 shared by the
  batch (randomized positions, Ruoss et al. 2023), else 0 … T − 1 (its default
  `max_length=0`). Ours takes them as inputs; 'fire:randomized' with
  `positions.draw='per_batch'` and `positions.randomized_eval='contiguous'` is
  the code's randomized scheme.
* Layers: the code builds one FIRE per attention layer, and so does a
  `TransformerLM` here (`per_layer = True`; `encoding_per_layer=False`
  shares one MLP, c and L across the layers instead).

Bidirectional attention (`causal=False`, not in the paper, whose models are
causal LMs) uses |i − j|, which is what the code's |·| computes anyway: the
bias is the same function for both; it cannot tell left from right. The
normaliser stays max(L, i), so keys at j > i can give inputs above 1.
"""


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.scores import relative_distance
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import torch_linear_init
from attention_jax.positional.base import dense_spec
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.base import not_linear
from attention_jax.positional.base import real_option
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import param


def fire_psi(c: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
  """ψ(x) = log(|c · x| + 1), float32, elementwise (any shape)."""
  return jnp.log1p(jnp.abs(jnp.asarray(c, jnp.float32) * jnp.asarray(x, jnp.float32)))


def fire_bias(w1: jnp.ndarray, b1: jnp.ndarray, w2: jnp.ndarray, b2: jnp.ndarray,
              c: jnp.ndarray, threshold: jnp.ndarray, q_positions, k_positions,
              eps: float = 1e-6) -> jnp.ndarray:
  """The FIRE bias from its parameters and integer positions.

  Args:
    w1: float `[1, W]`, b1 `[W]`: the MLP's first layer (kernel `[in, out]`).
    w2: float `[W, H]`, b2 `[H]`: its second layer, one output per head.
    c: float scalar, the log transform's scale (|c| is used).
    threshold: float scalar L >= 0 (|L| is used); queries at i < L are
      normalised by ψ(L).
    q_positions: integer `[T_q]` or `[B, T_q]`.
    k_positions: integer `[T_k]` or `[B, T_k]`.
    eps: added to the normaliser ψ(max(L, i)).

  Returns:
    float32 `[H, T_q, T_k]` (or `[B, H, T_q, T_k]` for batched positions).
  """
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  distance = relative_distance(q_positions, k_positions)  # int32 [..., T_q, T_k]
  q = f32(q_positions)
  # The normaliser belongs to the query (row), as in the code.
  normaliser = jnp.maximum(q, jnp.abs(f32(threshold)))[..., :, None]  # [..., T_q, 1]
  x = fire_psi(c, distance) / (fire_psi(c, normaliser) + eps)  # [..., T_q, T_k]
  hidden = jax.nn.relu(x[..., None] * f32(w1)[0] + f32(b1))  # [..., T_q, T_k, W]
  # HIGHEST: f32 on every backend (GPUs would otherwise use TF32 for this matmul).
  out = jnp.einsum('...qkw,wh->...hqk', hidden, f32(w2),
                   precision=jax.lax.Precision.HIGHEST)
  return out + f32(b2)[:, None, None]


class FIRE(PositionalEncoding):
  """'fire': a learned MLP of the log-normalised distance, one output per head."""

  per_layer = True  # the reference code gives every attention layer its own FIRE

  def __init__(self, num_heads: int, *, rngs: nnx.Rngs, mlp_width: int = 32,
               init_c: float = 0.1, init_threshold: float = 512.0, eps: float = 1e-6):
    self.num_heads = num_heads
    self.eps = float(eps)  # static: a constant of the graph
    self.init_threshold = float(init_threshold)  # L₀, not trained (the code's frozen init_L)
    # The MLP's few hidden units are replicated: only its heads' outputs split.
    init = lambda fan_in, shape, axes: param(torch_linear_init(rngs.params(), fan_in, shape),
                                             axes)
    self.w1 = init(1, (1, mlp_width), (None, None))
    self.b1 = init(1, (mlp_width,), (None,))
    self.w2 = init(mlp_width, (mlp_width, num_heads), (None, HEADS))
    self.b2 = init(mlp_width, (num_heads,), (HEADS,))
    self.c = param(init_c, ())
    self.threshold_scale = param(1.0, ())  # the code's L_multiplier

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, mlp_width: int = 32,
            init_c: float = 0.1, init_threshold: float = 512.0, eps: float = 1e-6):
    """Options: `mlp_width` W (hidden units of f_θ, >= 1), `init_c` c's start
    (> 0), `init_threshold` L₀ (> 0; L = |s · L₀| with s learned from 1),
    `eps` (> 0, added to the normaliser). The defaults are the reference
    code's."""
    # Any length works; |i − j| serves both causal and bidirectional attention.
    del d_model, max_positions, causal
    if (isinstance(mlp_width, bool) or not isinstance(mlp_width, (int, np.integer))
        or mlp_width < 1):
      raise ValueError(f'fire: mlp_width={mlp_width!r} must be an integer >= 1.')
    # c = 0 would give f_θ a constant input; eps keeps 0 / 0 away should c reach 0.
    init_c = real_option('fire', 'init_c', init_c, above=0)
    init_threshold = real_option('fire', 'init_threshold', init_threshold, above=0)
    eps = real_option('fire', 'eps', eps, above=0)
    if rngs is None:
      raise ValueError('fire: needs rngs (nnx.Rngs) to initialise its MLP.')
    return cls(num_heads, rngs=rngs, mlp_width=int(mlp_width), init_c=init_c,
               init_threshold=init_threshold, eps=eps)

  def threshold(self) -> jnp.ndarray:
    """The current threshold L = |s · L₀|, a float32 scalar."""
    return jnp.abs(self.threshold_scale[...].astype(jnp.float32) * self.init_threshold)

  def attention_bias(self, q_positions, k_positions):
    """-> float32 `[1|B, H, T_q, T_k]`."""
    return heads_rank4(fire_bias(self.w1[...], self.b1[...], self.w2[...], self.b2[...],
                                 self.c[...], self.threshold(), q_positions, k_positions,
                                 self.eps))

  def score_contribution(self, context):
    """`attention_bias` at the call's positions, as a `DenseBias`."""
    return dense_spec(self.attention_bias(context.q_positions, context.k_positions),
                      not_linear(self))
