"""The 'cudnn' kernel: `jax.nn.dot_product_attention(implementation='cudnn')`,
the fused GPU kernel. No weights.

cuDNN's rules, each a column of its row in `dispatch.KERNELS` (from
`jax._src.cudnn.fused_attention_stablehlo` and jax.nn's cudnn path):
float16/bfloat16; head_dim a multiple of 8 up to 128 (256 on Hopper and
later, which the table cannot see); D_v == D (jax.nn wants v shaped as k);
a sliding window only on the left, so only with causal: our `|i - j| <
window` is its `local_window_size=(window - 1, 0)`, a sliding window of
length `window`; mask and bias become one bias array whose last two axes
must be the full T_q × T_k (broadcast over batch and heads only), and with
a bias the backward wants even T_q and T_k. Grouped-query heads and key
padding it takes as they are.

A bias is cast to the input dtype floored at `_BIAS_FLOOR`: jax.nn adds its
own large negative for a mask (-2¹⁵ in float16, -2⁴¹ in bfloat16) on top,
and the sum must stay finite (a masked score of -0.7 · float32 max is -inf in
float16).

A query row with no key to attend follows jax.nn's convention (the mean of
V), not ours (zeros, see `dense.py`): this kernel is here for GPU speed, not
for exactness tests.

`jax.nn.dot_product_attention` takes neither a logit soft cap nor sink
logits, so the row refuses `logit_soft_cap=` and `sinks=` (its `soft_cap`
and `sinks` columns are off).
"""

import jax
import jax.numpy as jnp

from attention_jax.attention.scores import materialise

# Half of jax.nn's mask value for cuDNN, per dtype (see the module docstring).
_BIAS_FLOOR = {'float16': -2.0 ** 14, 'bfloat16': -2.0 ** 40}


def cudnn_kernel(q, k, v, *, mask, scores, causal, window, kv_lengths, return_weights,
                 normalization=None, **unused_options):
  """q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`; mask
  rank 4 or None; scores a tuple of score specs, all materialised: cuDNN
  takes a bias array. Softmax only (the dispatcher sends no other
  normalization). -> (out `[B, T_q, H, D_v]`, None)."""
  del unused_options  # other kernels' options (chunk sizes)
  if return_weights or normalization is not None:
    raise ValueError('cudnn_kernel forms no weights and runs softmax attention only.')
  if window is not None and not causal:
    raise ValueError(f'cudnn_kernel: window={window} needs causal=True (cuDNN has no '
                     'right-hand window).')
  bias = materialise(scores, q.shape[1], k.shape[1])
  if bias is not None:
    floor = _BIAS_FLOOR.get(jnp.dtype(q.dtype).name, -jnp.inf)
    bias = jnp.maximum(bias, floor).astype(q.dtype)
  out = jax.nn.dot_product_attention(
      q, k, v, bias=bias, mask=mask, is_causal=causal,
      key_value_seq_lengths=None if kv_lengths is None else jnp.asarray(kv_lengths, jnp.int32),
      local_window_size=None if window is None else (window - 1, 0),
      implementation='cudnn')
  return out, None
