"""Forgetting attention, FoX (Lin et al., ICLR 2025).

"Forgetting Transformer: Softmax Attention with a Forget Gate", arXiv
2503.02130. Each head h has a scalar forget gate per token, computed from the
attention layer's input x_t `[d_model]`:

    f_t[h] = σ(x_t · w_h + b_h)                       (in (0, 1))
    bias[h, i, j] = Σ_{l=j+1..i} log f_l[h] = c_i[h] − c_j[h],   j <= i
    c_t[h] = Σ_{l<=t} log f_l[h]                      (float32 cumsum)

added to the scores q_i·k_j/√D before the causal softmax. A key's weight
decays by the gates of every token after it: a head whose gates stay near 1
attends like plain softmax attention, one with gates near 0 only to the
latest tokens. No positions are read (FoX needs no positional embedding); the
token indices enter through the cumulative sum alone.

In a module the encoding acts through two hooks: `token_features(x)` gives
log f `[B, T, H]` of the layer input (a key/value cache stores the keys'
ones), `score_contribution` turns them into a `DifferenceBias(c_q, c_k)`: O(T)
numbers, which the chunked kernel rebuilds block by block (O(T) memory,
gradients to both) and the dense kernel materialises. `forget_gate_bias` is
the dense bias as a pure function, for reference and tests.

Layout: every per-token array (log f, c, the `DifferenceBias` values) is in
Flax's order `[B, T, H]`, batch, length, heads; only the dense bias is the
scores' `[B, H, T_q, T_k]`.

Matching the official code. Reference: github.com/zhixuan-lin/forgetting-transformer
(snapshot 883f260c): the op `src/forgetting_transformer/ops/forgetting_attention.py`
(last changed in 15ec3008; its reference path is the PyTorch one in `test_op`)
and the layer `ForgettingAttentionLayer` in
`src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py`.
tests/positional/test_forgetting.py transcribes the op's reference and the layer's gate.
The paper's formula and the code's agree; where the code and ours differ:

* The gate is the code's default `fgate_type='full'`: `fgate_proj =
  nn.Linear(hidden_size, num_heads, bias=True)` applied to the block's input
  after its pre-norm (`attn_norm`, an RMSNorm there; here the block's
  LayerNorm, whatever precedes attention), one per layer. Ours: the same
  (`per_layer = True`), parameters `gate_kernel [d_model, H]`, `gate_bias [H]`.
* Initialisation: the code's `_init_weights`, weight N(0, 0.02²)
  (`initializer_range`), bias 0, so every gate starts near σ(0) = 1/2. Ours:
  the defaults (`weight_std=0.02`, `bias_init=0.0`). `decay_times=(T_min,
  T_max)` is the code's `fgate_bias_init` (b_h = −log(expm1(1/t_h)), t_h
  log-spaced from T_min to T_max, so log σ(b_h) = −1/t_h), which the code
  allows only for its data-independent gates ('bias_only', 'fixed'); here it
  may start the full gate too.
* Precision: the code projects under bf16 autocast, then casts the logit to
  float32 for `logsigmoid` and the cumsum. Ours computes the projection in
  float32 too (HIGHEST precision), whatever the module's dtype; log σ and
  the cumsum are float32 as there.
* Left padding: the code's `seq_start` zeroes log f before each row's start
  so padding cannot move c. Ours pads on the right (`kv_lengths`): padding
  comes after every key a real query sees, so it never enters c_i − c_j.
* Left out: adaptive computation pruning (`log_pruning_tolerance`, the
  op's `adaptive_threshold`: an approximate speed-up skipping blocks whose
  bias is below a bound; ours is exact); the gate types 'bias_only', 'fixed'
  and 'none'; and the "Pro" block's extras: the output gate (`ogate_proj`),
  the per-head output RMSNorm, QK-norm and the data-dependent key/value
  shift (`ShiftLinear`). RoPE: the code's default is `use_rope=False` (the
  paper's FoX has no positional embedding); one registry encoding cannot be
  combined with 'rope' here.
* Grouped-query attention: the code refuses it ("GQA has not been tested");
  ours has one gate per query head and serves any `num_kv_heads`.
* Causal only, as the op (`assert causal`): `build(causal=False)` and a
  cross-attention call (no q_slots) are ValueErrors.

Precision note: c_t grows like t · mean(log f) (−0.69 per token at init),
and c_i − c_j loses float32 digits as |c| grows (about 1e-3 absolute at
|c| ~ 1e4), as it does in the code's float32 cumsum.
"""

import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import is_arange
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.base import real_option
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import param


def log_forget_gates(x: jnp.ndarray, kernel: jnp.ndarray, bias: jnp.ndarray) -> jnp.ndarray:
  """log f = log σ(x W + b): x `[B, T, d_model]`, kernel W `[d_model, H]`,
  bias b `[H]` -> float32 `[B, T, H]` (all in float32, any input dtype)."""
  # HIGHEST: float32 on every backend (GPUs would otherwise use TF32 here).
  logits = jnp.einsum('btd,dh->bth', jnp.asarray(x, jnp.float32),
                      jnp.asarray(kernel, jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)
  # log_sigmoid = −softplus(−z): finite for any logit, unlike log(sigmoid(z)).
  return jax.nn.log_sigmoid(logits + jnp.asarray(bias, jnp.float32))


def cumulative_log_gates(log_fgate: jnp.ndarray) -> jnp.ndarray:
  """c_t = Σ_{l<=t} log f_l: log_fgate `[B, T, H]` -> float32 `[B, T, H]`."""
  return jnp.cumsum(jnp.asarray(log_fgate, jnp.float32), axis=1)


def forget_gate_bias(log_fgate: jnp.ndarray, *, cumulative: bool = False) -> jnp.ndarray:
  """The dense forgetting bias c_i − c_j = Σ_{l=j+1..i} log f_l.

  Args:
    log_fgate: log forget gates float `[B, T, H]`, or with `cumulative=True`
      their cumulative sums c `[B, T, H]` (`cumulative_log_gates`).
    cumulative: whether `log_fgate` is already c.

  Returns:
    float32 `[B, H, T, T]` (query i, key j). Entries above the diagonal
    (j > i) are −(the sum over i+1 … j), meant to be hidden by a causal mask.
  """
  if jnp.ndim(log_fgate) != 3:
    raise ValueError(f'fox: forget_gate_bias takes [B, T, H] log gates (or their '
                     f'cumulative sums, cumulative=True), got shape {jnp.shape(log_fgate)}.')
  c = (jnp.asarray(log_fgate, jnp.float32) if cumulative
       else cumulative_log_gates(log_fgate))
  c = jnp.swapaxes(c, 1, 2)  # [B, H, T]: the scores' heads-first layout
  return c[..., :, None] - c[..., None, :]


def decay_time_bias(num_heads: int, t_min: float, t_max: float) -> np.ndarray:
  """Gate biases whose gates σ(b_h) = exp(−1/t_h) forget with decay times t_h
  log-spaced from t_min to t_max (the code's `fgate_bias_init`): float32 `[H]`."""
  t = np.exp(np.linspace(math.log(t_min), math.log(t_max), num_heads))
  return (-np.log(np.expm1(1.0 / t))).astype(np.float32)


class FoX(PositionalEncoding):
  """'fox': a data-dependent forget gate per head; adds c_i − c_j to the scores.

  Args:
    d_model: width of the layer input the gate reads.
    num_heads: attention (query) heads, one gate each.
    rngs: `nnx.Rngs` for the gate's kernel.
    weight_std: standard deviation of the kernel's normal initialisation.
    bias: initial gate bias, a float or float `[H]`.
  """

  # One gate per layer, as in the official model.
  per_layer = True

  def __init__(self, d_model: int, num_heads: int, *, rngs: nnx.Rngs,
               weight_std: float = 0.02, bias=0.0):
    self.d_model, self.num_heads = d_model, num_heads
    self.causal = True  # MultiHeadAttention refuses a causal=False module with it
    self.gate_kernel = param(weight_std * jax.random.normal(
        rngs.params(), (d_model, num_heads), jnp.float32), (EMBED, HEADS))
    self.gate_bias = param(jnp.broadcast_to(jnp.asarray(bias, jnp.float32), (num_heads,)),
                           (HEADS,))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            weight_std: float = 0.02, bias_init: float = 0.0,
            decay_times: Optional[Sequence[float]] = None):
    """Options: `weight_std` (>= 0) the gate kernel's initial std;
    `bias_init` one initial bias for every head (0: gates start at 1/2);
    `decay_times` (T_min, T_max), both > 0, per-head biases instead (see
    `decay_time_bias`); None or () for off. Defaults: the official code's."""
    del max_positions  # any length: nothing is tabulated
    if not causal:
      raise ValueError('fox: forgetting attention is causal (a key decays by the gates of '
                       'the tokens after it, up to the query); causal=False is not '
                       'supported.')
    weight_std = real_option('fox', 'weight_std', weight_std, at_least=0)
    bias = bias_init = real_option('fox', 'bias_init', bias_init)
    if decay_times is not None and not isinstance(decay_times, (tuple, list, np.ndarray)):
      raise ValueError(f'fox: decay_times={decay_times!r} must be (T_min, T_max), () or None.')
    times = () if decay_times is None else tuple(decay_times)
    if times:
      if len(times) != 2:
        raise ValueError(f'fox: decay_times={decay_times!r} must be (T_min, T_max), () or '
                         'None.')
      t_min = real_option('fox', 'decay_times[0]', times[0], above=0)
      t_max = real_option('fox', 'decay_times[1]', times[1], above=0)
      if bias_init != 0.0:
        raise ValueError(f'fox: give bias_init={bias_init!r} or decay_times={times!r}, '
                         'not both.')
      bias = decay_time_bias(num_heads, t_min, t_max)
    if rngs is None:
      raise ValueError('fox: needs rngs (nnx.Rngs) to initialise its gate kernel.')
    return cls(d_model, num_heads, rngs=rngs, weight_std=weight_std, bias=bias)

  def token_features(self, x: jnp.ndarray) -> jnp.ndarray:
    """x `[B, T, d_model]` (the layer input) -> log f, float32 `[B, T, H]`."""
    if x.ndim != 3 or x.shape[-1] != self.d_model:
      raise ValueError(f'fox: the gate reads layer inputs [B, T, {self.d_model}], got '
                       f'{x.shape}.')
    return log_forget_gates(x, self.gate_kernel[...], self.gate_bias[...])

  def score_contribution(self, context: ScoreContext) -> DifferenceBias:
    """`DifferenceBias(c_q [B, T_q, H], c_k [B, T_k, H])`: c the cumulative
    log gates of the keys, c_q their values at the queries' slots."""
    if context.q_slots is None:
      raise ValueError('fox: forgetting attention needs each query\'s place among the keys '
                       '(q_slots); cross-attention has none.')
    if not context.causal:
      raise ValueError('fox: forgetting attention is causal; this call has causal=False.')
    if context.k_features is None:
      raise ValueError('fox: the keys\' log forget gates (k_features) are missing.')
    c_k = cumulative_log_gates(context.k_features)  # [B, T_k, H]
    slots = context.q_slots
    if is_arange(slots) and len(slots) == c_k.shape[1]:
      c_q = c_k  # a full pass: every key is a query
    else:
      c_q = jnp.take(c_k, jnp.asarray(slots, jnp.int32), axis=1)
    return DifferenceBias(c_q, c_k, origin='the forget gates of fox')
