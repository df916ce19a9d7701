"""PaTH, and PaTH-FoX (Yang et al., NeurIPS 2025): positions as a
data-dependent product of Householder-like transforms.

"PaTH Attention: Position Encoding via Accumulating Householder
Transformations", arXiv 2505.16381. Where RoPE rotates q_i and k_j by a
fixed angle per position, PaTH carries the key through one transform per
token between it and the query, each read from that token:

    logit[i, j] = k_jᵀ H_{j+1} … H_i q_i,   H_s = I − β_s w_s w_sᵀ
    w_s = l2norm(silu(short_conv(x W_w))_s) per key head   (‖w_s‖ = 1)
    β_s = 2 σ(x_s · w_β + b_β) per key head                  (in (0, 2))

then softmax(logit / √D) as usual. PaTH-FoX ('path_fox') adds FoX's forget
gate per query head, log f_s = log σ(x_s · w_f + b_f), as c_i − c_j (c the
cumulative log gates) to the logits before the 1/√D scale.

In a module it acts through two hooks: `token_features(x)` gives each
token's numbers (the projection x W_w before the convolution, β, and log f
for PaTH-FoX), which a key/value cache keeps as it keeps FoX's gates;
`score_contribution` turns the keys' into w (the convolution runs over the
key slots) and returns a `HouseholderScores` spec (`attention/path.py`: q·k
replaced by the transformed logits), with a `DifferenceBias` for the gate.
The dense kernel materialises them; 'path_blockwise' builds them block by
block in O(T) memory ('auto' from 256 keys).

Layout: per-token arrays in Flax's order `[B, T, heads, ...]`.

Matching the official code. Reference: fla-org/flash-linear-attention
(snapshot bc3b101d), the layer `PaTHAttention` in fla/layers/path_attn.py,
the op fla/ops/path_attn/ (`parallel_path_attn`, `naive_path_attn` in
naive.py), and the model's `_init_weights` in
fla/models/path_attn/modeling_path_attention.py.
tests/attention/test_path.py transcribes `naive_path_attn`;
tests/positional/test_path.py transcribes the layer's parametrisation. Where
ours differs:

* Parametrisation as the layer's defaults: w from a low-rank projection
  d_model → 32 → H_kv·D (`use_low_rank_w=True`; `low_rank_w=False`: one
  d_model → H_kv·D matrix), then the depthwise causal short convolution of
  width 3 without bias, SiLU (`use_w_shortconv=True`, `conv_size=3`), split
  into heads and L2-normalised with eps 1e-6 inside the root (FLA's
  `l2_norm`); β = 2σ(x W_β + b_β), one per key head (`bt_proj`, with
  bias); PaTH-FoX's gate log σ(x W_f + b_f), one per query head (`g_proj`,
  with bias). Initialisation as the model's `_init_weights`: every weight
  (the convolution's too) N(0, 0.02²), biases 0 (β starts near 1, gates
  near 1/2).
* Key heads: the layer knows its `num_kv_heads`; an encoding here is built
  from d_model and num_heads only, so w and β have `num_kv_heads` heads
  given as an option (default num_heads). With GQA, pass the module's
  num_kv_heads to match FLA; any divisor of num_heads works (query head h
  reads w of head h // (H / num_kv_heads)).
* The projections of w, β and the gate read the attention layer's input
  (after the block's pre-norm), as FLA's do; computed in float32 (HIGHEST)
  whatever the module's dtype (FLA: the model's dtype, β and the gate cast
  to float32 after the projection, w after the convolution).
* Cached decoding: FLA's layer updates the cached keys in place by each new
  token's H (`rank_one_update`; `prepare_k_cache` after a prefill) and keeps
  the convolution's last inputs. Here the cache keeps the raw keys and each
  token's features (as FoX's gates), and a query at slot p applies H_s for
  s <= p only (`path_logits_at`), so the cached keys stay valid when slots
  are rewritten (the library's greedy decoding prefills teacher-forced
  tokens, then overwrites them). Equal results; but each decoded token
  recomputes the cache's UT forms, O(T · C · D) work with blocks of C
  (FLA: O(T · D) for the rank-one update of every cached key).
* Left out: `use_qk_norm` (default off there), variable-length packing
  (`cu_seqlens`; here right padding with `kv_lengths`), the attention-
  residual extras of FLA's model. Causal only, as the op: `causal=False`
  and cross-attention are ValueErrors.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.attention.path import HouseholderScores
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import is_arange
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import flag_option
from attention_jax.positional.base import integer_option
from attention_jax.positional.base import real_option
from attention_jax.positional.forgetting import cumulative_log_gates
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import KV_HEADS
from attention_jax.positional.parameters import param

HIGHEST = jax.lax.Precision.HIGHEST
W_RANK = 32  # FLA's low-rank w projection: d_model -> 32 -> H_kv·D
L2_EPS = 1e-6  # FLA's l2_norm: x / sqrt(Σx² + eps)


def _project(x, kernel):
  return jnp.einsum('btd,df->btf', jnp.asarray(x, jnp.float32),
                    jnp.asarray(kernel, jnp.float32), precision=HIGHEST)


def short_convolution(x: jnp.ndarray, kernel: jnp.ndarray,
                      segment_ids: Optional[jnp.ndarray] = None) -> jnp.ndarray:
  """FLA's `ShortConvolution` without bias, then SiLU: a depthwise causal
  convolution over the length axis, y_t = Σ_m kernel[m] · x_{t−K+1+m} (zeros
  before the start). x float32 `[B, T, F]`, kernel `[K, F]` -> `[B, T, F]`.
  With segment ids int `[B, T]` (packed documents), a tap on another
  document's token reads zero, as before the start: each document's w is
  what it is alone (FLA resets the convolution at each `cu_seqlens` start)."""
  width = kernel.shape[0]
  padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
  t = x.shape[1]
  if segment_ids is None:
    y = sum(padded[:, m:m + t] * kernel[m] for m in range(width))
    return jax.nn.silu(y)
  ids = jnp.asarray(segment_ids, jnp.int32)
  # Before the start: an id no token has, so the tap reads zero there too.
  padded_ids = jnp.pad(ids, ((0, 0), (width - 1, 0)), constant_values=jnp.iinfo(jnp.int32).min)
  y = sum(jnp.where((padded_ids[:, m:m + t] == ids)[..., None], padded[:, m:m + t], 0.0)
          * kernel[m] for m in range(width))
  return jax.nn.silu(y)


def l2_normalize(x: jnp.ndarray, eps: float = L2_EPS) -> jnp.ndarray:
  """x / sqrt(Σ x² + eps) over the last axis (FLA's `l2_norm`)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)


class PaTH(PositionalEncoding):
  """'path' (and 'path_fox' with `forget_gate=True`): Householder transforms
  of q·k read from the tokens (module docstring).

  Args:
    d_model: width of the layer input the projections read.
    num_heads: query heads (head_dim = d_model // num_heads).
    rngs: `nnx.Rngs` for the parameters.
    num_kv_heads: heads of w and β (FLA: the layer's key/value heads).
    forget_gate: PaTH-FoX's gate, one per query head.
    low_rank_w: w's projection through rank 32 (FLA's default) or full.
    conv_size: the short convolution's width; 0 for none (FLA's
      `use_w_shortconv=False`).
    weight_std: the weights' initial standard deviation.
    block_size: the block length of the UT form (None: 64).
  """

  per_layer = True  # one per layer, as FLA's layer

  def __init__(self, d_model: int, num_heads: int, *, rngs: nnx.Rngs,
               num_kv_heads: Optional[int] = None, forget_gate: bool = False,
               low_rank_w: bool = True, conv_size: int = 3, weight_std: float = 0.02,
               block_size: Optional[int] = None):
    self.d_model, self.num_heads = d_model, num_heads
    self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    self.head_dim = d_model // num_heads
    self.causal = True  # MultiHeadAttention refuses a causal=False module with it
    self.forget_gate, self.block_size = forget_gate, block_size
    width = self.num_kv_heads * self.head_dim
    # Axis names for sharding (`parameters.param`): w's flattened
    # kv_heads × head_dim width and its low rank stay unnamed (replicated).
    normal = lambda axes, *shape: param(
        weight_std * jax.random.normal(rngs.params(), shape, jnp.float32), axes)
    if low_rank_w:
      self.w_down = normal((EMBED, None), d_model, W_RANK)
      self.w_up = normal((None, None), W_RANK, width)
    else:
      self.w_down, self.w_up = normal((EMBED, None), d_model, width), None
    self.w_conv = normal((None, None), conv_size, width) if conv_size else None
    self.beta_kernel = normal((EMBED, KV_HEADS), d_model, self.num_kv_heads)
    self.beta_bias = param(jnp.zeros((self.num_kv_heads,), jnp.float32), (KV_HEADS,))
    if forget_gate:
      self.gate_kernel = normal((EMBED, HEADS), d_model, num_heads)
      self.gate_bias = param(jnp.zeros((num_heads,), jnp.float32), (HEADS,))
    else:
      self.gate_kernel = self.gate_bias = None

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            num_kv_heads: Optional[int] = None, forget_gate: bool = False,
            low_rank_w: bool = True, conv_size: int = 3, weight_std: float = 0.02,
            block_size: Optional[int] = None):
    """Options: `num_kv_heads` (dividing num_heads; None: num_heads) the heads
    of w and β; `forget_gate` PaTH-FoX; `low_rank_w`, `conv_size` (>= 0)
    and `weight_std` (>= 0) as FLA's layer; `block_size` (>= 1 or None) the
    UT form's block. Defaults: FLA's."""
    del max_positions  # any length: nothing is tabulated
    name = 'path_fox' if forget_gate is True else 'path'
    if not causal:
      raise ValueError(f'{name}: PaTH is causal (a key is carried through the transforms '
                       'of the tokens after it, up to the query); causal=False is not '
                       'supported.')
    if d_model % num_heads:
      raise ValueError(f'{name}: num_heads={num_heads} must divide d_model={d_model}.')
    if num_kv_heads is not None:
      num_kv_heads = integer_option(name, 'num_kv_heads', num_kv_heads, at_least=1)
      if num_heads % num_kv_heads:
        raise ValueError(f'{name}: num_kv_heads={num_kv_heads} must divide '
                         f'num_heads={num_heads}.')
    forget_gate = flag_option(name, 'forget_gate', forget_gate)
    low_rank_w = flag_option(name, 'low_rank_w', low_rank_w)
    conv_size = integer_option(name, 'conv_size', conv_size, at_least=0)
    weight_std = real_option(name, 'weight_std', weight_std, at_least=0)
    if block_size is not None:
      block_size = integer_option(name, 'block_size', block_size, at_least=1)
    if rngs is None:
      raise ValueError(f'{name}: needs rngs (nnx.Rngs) to initialise its projections.')
    return cls(d_model, num_heads, rngs=rngs, num_kv_heads=num_kv_heads,
               forget_gate=forget_gate, low_rank_w=low_rank_w, conv_size=conv_size,
               weight_std=weight_std, block_size=block_size)

  @property
  def _name(self) -> str:
    return 'path_fox' if self.forget_gate else 'path'

  def token_features(self, x: jnp.ndarray) -> jnp.ndarray:
    """x `[B, T, d_model]` (the layer input) -> float32 `[B, T, F]`: the w
    projection before the convolution (H_kv·D), β (H_kv), and with the
    forget gate log f (H)."""
    if x.ndim != 3 or x.shape[-1] != self.d_model:
      raise ValueError(f'{self._name}: the projections read layer inputs [B, T, '
                       f'{self.d_model}], got {x.shape}.')
    w = _project(x, self.w_down[...])
    if self.w_up is not None:
      w = _project(w, self.w_up[...])
    beta = 2.0 * jax.nn.sigmoid(_project(x, self.beta_kernel[...]) + self.beta_bias[...])
    parts = [w, beta]
    if self.forget_gate:
      parts.append(jax.nn.log_sigmoid(_project(x, self.gate_kernel[...])
                                      + self.gate_bias[...]))
    return jnp.concatenate(parts, -1)

  def householder(self, k_features: jnp.ndarray,
                  segment_ids: Optional[jnp.ndarray] = None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The keys' features `[B, T_k, F]` -> (w `[B, T_k, H_kv, D]` unit
    vectors, β `[B, T_k, H_kv]`); the convolution runs over the T_k slots,
    within each document when the keys' segment ids `[B, T_k]` are given."""
    g, d = self.num_kv_heads, self.head_dim
    w = k_features[..., :g * d]
    if self.w_conv is not None:
      w = short_convolution(w, jnp.asarray(self.w_conv[...], jnp.float32), segment_ids)
    w = l2_normalize(w.reshape(*w.shape[:2], g, d))
    return w, k_features[..., g * d:g * d + g]

  def score_contribution(self, context: ScoreContext):
    """`HouseholderScores` of the call's q and k (a full pass: no slots;
    over a cache: the queries' slots), and for PaTH-FoX a `DifferenceBias`
    of the cumulative log gates, scaled by 1/√D as FLA adds them."""
    if context.q_slots is None:
      raise ValueError(f'{self._name}: PaTH needs each query\'s place among the keys '
                       '(q_slots); cross-attention has none.')
    if not context.causal:
      raise ValueError(f'{self._name}: PaTH is causal; this call has causal=False.')
    if context.k_features is None:
      raise ValueError(f'{self._name}: the keys\' features (k_features) are missing.')
    if context.q.shape[-1] != self.head_dim:
      raise ValueError(f'{self._name}: built for head_dim {self.head_dim}, the call\'s q is '
                       f'{context.q.shape}.')
    # The transforms between a key and a query of one document are that
    # document's (the segment mask hides the rest); only the convolution
    # reaches across a boundary, so it is cut there.
    w, beta = self.householder(context.k_features, context.k_segment_ids)
    slots = context.q_slots
    full = is_arange(slots) and len(slots) == context.k.shape[1] == context.q.shape[1]
    transform = HouseholderScores(context.q, context.k, w, beta,
                                  q_slots=None if full else jnp.asarray(slots, jnp.int32),
                                  block_size=self.block_size,
                                  origin=f'the transforms of {self._name}')
    if not self.forget_gate:
      return transform
    scale = self.head_dim ** -0.5
    c_k = cumulative_log_gates(context.k_features[..., -self.num_heads:]) * scale
    c_q = c_k if full else jnp.take(c_k, jnp.asarray(slots, jnp.int32), axis=1)
    return transform, DifferenceBias(c_q, c_k, origin='the forget gates of path_fox')


class PaTHFoX(PaTH):
  """'path_fox': PaTH with FoX's forget gate (`PaTH` with forget_gate=True)."""

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            num_kv_heads: Optional[int] = None, forget_gate: bool = True,
            low_rank_w: bool = True, conv_size: int = 3, weight_std: float = 0.02,
            block_size: Optional[int] = None):
    """The options of `PaTH.build`, `forget_gate` True by default."""
    return PaTH.build.__func__(
        cls, d_model=d_model, num_heads=num_heads, max_positions=max_positions,
        causal=causal, rngs=rngs, num_kv_heads=num_kv_heads, forget_gate=forget_gate,
        low_rank_w=low_rank_w, conv_size=conv_size, weight_std=weight_std,
        block_size=block_size)

