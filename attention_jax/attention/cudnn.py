"""The 'cudnn' kernel: `jax.nn.dot_product_attention(implementation='cudnn')`,
the fused GPU kernel (float16/bfloat16, head_dim a multiple of 8 up to 128;
see its row in `dispatch.KERNELS`). No weights.

A query row with no key to attend follows jax.nn's convention (the mean of
V), not ours (zeros, see `dense.py`): this kernel is here for GPU speed, not
for exactness tests.
"""

import jax

from attention_jax.attention.scores import materialise


def cudnn_kernel(q, k, v, *, mask, bias, slopes, causal, window, kv_lengths,
                 return_weights, difference=None, normalization=None, **unused_options):
  """q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`; mask
  and bias rank 4 or None; slopes `[H]` and difference (a `DifferenceBias`)
  or None, both materialised: cuDNN takes a bias array. Softmax only (the
  dispatcher sends no other normalization). -> (out `[B, T_q, H, D_v]`, None)."""
  del unused_options  # other kernels' options (chunk sizes)
  if return_weights or normalization is not None:
    raise ValueError('cudnn_kernel forms no weights and runs softmax attention only.')
  bias = materialise(bias, slopes, q.shape[1], k.shape[1], difference)
  out = jax.nn.dot_product_attention(
      q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
      is_causal=causal, key_value_seq_lengths=kv_lengths,
      local_window_size=None if window is None else (window - 1, window - 1),
      implementation='cudnn')
  return out, None
