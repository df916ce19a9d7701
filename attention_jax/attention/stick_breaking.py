"""Stick-breaking attention, dense (Tan et al., ICLR 2025, arXiv 2410.17980).

No softmax. With z_ij = q_i·k_j/√D + bias_ij, query i gives key j

    A_ij = σ(z_ij) · ∏_{k visible, j < k} (1 - σ(z_ik)),

the keys read from the nearest back to the first, each taking its share
σ(z) of the stick the later keys left. Computed in log space, as the
official reference (shawntan/stickbreaking-attention,
stickbreaking_attention/sb_ref.py, `stickbreaking`) does it:
log A_ij = log σ(z_ij) + Σ_{k > j} log σ(-z_ik), in float32.

The rows of A sum to at most 1; the remainder r_i = 1 - Σ_j A_ij goes where
`StickBreaking.remainder` says, and the two official codes differ here:

* 'value' (default): `Σ_j A_ij v_j + r_i v_i`, the query's own value, as
  the official *tests* add it (tests/test_attn.py `ref_fwd`:
  `o + rem[..., None] * v`).
* 'head_bias': the authors' *model code* (IBM/dolomite-engine, now
  lm_engine/hf_models/modeling_utils/sequence_mixer_blocks/
  stickbreaking_attention.py, class `SBAttention`, commit d0ee1861) adds
  `rem[..., None] * head_bias` instead, head_bias a learned `[H, D]`
  starting at zero, then `GroupNorm(num_heads, hidden_size)` (each head's D
  channels normalised, with a learned scale and shift) before the output
  projection. Here the attention functions return `Σ_j A_ij v_j` alone and
  `MultiHeadAttention` adds the parameters' part (`nn.stick_breaking`).

The paper's equations give the output as Σ_j A_ij v_j; neither the remainder
term nor the GroupNorm is among them: both are choices of the code.

`attend_current` (official name and default False): whether key i itself
is among query i's keys (mask `triu(1)` instead of `triu(0)` there). Query
0 without it has no key: A = 0 and its output is v_0 (or b_h).

Matching the official code (sb_ref.py and tests/test_attn.py `ref_fwd`,
commit ea69b8dd; tests/attention/test_stick_breaking.py transcribes both): the same
weights (its mask `triu(0)` / `triu(1)` is our visible set, its `cum_weight
= tril(-1)` contraction our shifted suffix sum, masked keys log β = 0, so the
product runs over the visible keys only) and the same remainder to v_i.
One difference: the reference rounds log σ(z) and log β to the input dtype
before the contraction; we stay in float32 for bf16 inputs.

Shapes as `multi_head_attention`; the blockwise version, O(T) memory, is
`blockwise_stick_breaking.py`.
"""

import functools

import jax
import jax.numpy as jnp

from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_flag
from attention_jax.attention.checks import check_qkv

from attention_jax.attention.heads import map_heads
from attention_jax.attention.normalization import REMAINDERS


def stick_breaking_head(q, k, v, *, mask, bias, q_slots, attend_current,
                        remainder='value'):
  """One head. q `[T_q, D]`, k `[T_k, D]`, v `[T_k, D_v]`; mask bool `[T_q,
  T_k]` or None (True = may attend; the rule "only keys before the query's
  slot" is added here); bias `[T_q, T_k]` or None; q_slots int `[T_q]`, each
  query's own key index; remainder 'value' adds r_i v_i, 'head_bias' nothing
  (the module adds its part). -> (out `[T_q, D_v]` in v's dtype, weights
  float32 `[T_q, T_k]`, rows summing to at most 1)."""
  z = jnp.einsum('qd,kd->qk', q, k, preferred_element_type=jnp.float32)
  z = z * (1.0 / (q.shape[-1] ** 0.5))
  if bias is not None:
    z = z + bias.astype(jnp.float32)
  keys = jnp.arange(k.shape[0])[None, :]
  slots = jnp.asarray(q_slots, jnp.int32)[:, None]
  visible = keys <= slots if attend_current else keys < slots
  if mask is not None:
    visible = visible & mask
  log_beta = jnp.where(visible, jax.nn.log_sigmoid(-z), 0.0)
  # Σ_{k > j} log β_ik: the inclusive suffix sum shifted by one key (exact,
  # no subtraction of two large sums).
  suffix = jnp.flip(jnp.cumsum(jnp.flip(log_beta, -1), -1), -1)
  later = jnp.concatenate([suffix[:, 1:], jnp.zeros_like(suffix[:, :1])], -1)
  log_a = jax.nn.log_sigmoid(z) + later
  weights = jnp.where(visible, jnp.exp(jnp.where(visible, log_a, 0.0)), 0.0)
  out = jnp.einsum('qk,kd->qd', weights, v, preferred_element_type=jnp.float32)
  if remainder == 'value':
    rem = 1.0 - weights.sum(-1)
    own = jnp.take(v, jnp.clip(q_slots, 0, v.shape[0] - 1), axis=0).astype(jnp.float32)
    out = out + rem[:, None] * own
  return out.astype(v.dtype), weights


def stick_breaking_attention(q, k, v, *, mask=None, bias=None, q_slots=None,
                             attend_current=False, remainder='value',
                             return_weights=False):
  """Multi-head stick-breaking attention.

  Args:
    q, k, v: `[B, T_q, H, D]`, `[B, T_k, H_kv, D]`, `[B, T_k, H_kv, D_v]`.
    mask: bool `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]` (True = attend), or None.
    bias: additive `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`, or None.
    q_slots: int `[T_q]`: each query's own key index; default 0 … T_q-1 (a
      full causal pass, T_q == T_k).
    attend_current: see the module docstring.
    remainder: 'value' (add r_i v_i) or 'head_bias' (add nothing: the
      learned part belongs to `MultiHeadAttention`); see the module docstring.
    return_weights: also return the weights, as `scaled_dot_product_attention`.

  Returns:
    out `[B, T_q, H, D_v]` in v's dtype, or `(out, weights float32 [B, H,
    T_q, T_k])` with `return_weights`.
  """
  if remainder not in REMAINDERS:
    raise ValueError(f'stick_breaking_attention: remainder={remainder!r}; choose one of '
                     f'{REMAINDERS}.')
  q, k, v = check_qkv(q, k, v, 'stick_breaking_attention')
  attend_current = check_flag(None, 'attend_current', attend_current)
  return_weights = check_flag(None, 'return_weights', return_weights)
  if q_slots is not None:
    q_slots = check_array('q_slots', q_slots, ndim=1, kind='integer')
    if q_slots.shape != (q.shape[1],):
      raise ValueError(f'q_slots must be [T_q={q.shape[1]}] (each query\'s key index), got '
                       f'shape {tuple(q_slots.shape)}.')
  if q_slots is None:
    if q.shape[1] != k.shape[1]:
      raise ValueError(f'stick-breaking attention over {k.shape[1]} keys for {q.shape[1]} '
                       'queries needs q_slots (each query\'s own key index).')
    q_slots = jnp.arange(q.shape[1], dtype=jnp.int32)
  head = functools.partial(stick_breaking_head, q_slots=q_slots,
                           attend_current=attend_current, remainder=remainder)
  out, weights = map_heads(head, q, k, v, mask=mask, bias=bias,
                           name='stick_breaking_attention')
  return (out, weights) if return_weights else out
