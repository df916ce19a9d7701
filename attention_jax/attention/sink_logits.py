"""Learned attention sinks (gpt-oss; OpenAI 2025, `gpt_oss/torch/model.py`'s
`sdpa`): one learned logit σ_h per query head joins the softmax's
denominator and nothing else,

    w_ij = exp(s_ij) / (exp(σ_h) + Σ_j' exp(s_ij')),   out_i = Σ_j w_ij v_j,

so a head may give a query's weights a total below 1 (the sink has no
value: what it takes is attention paid to nothing). Named *sink logits*
here: they are NOT `WindowBias(sink=True)`, which keeps the first token(s)
visible to every query (StreamingLLM's sink tokens, real keys with values).

As gpt-oss's reference: σ `[H]`, one per query head (with grouped-query
attention, query head h of kv head h // (H / H_kv)), the logit taken as it
is (not scaled by 1/√D, not soft-capped, not masked). Unlike it, the
softmax runs in float32 whatever the dtype of the scores or the sinks (its
reference runs it in bfloat16). A query with no visible key gets weights
0 and output 0 (the sink takes everything), with no NaN.

Blockwise kernels join σ once, after the last key block: the running max
and normaliser (m, l, acc) become (m', l · e^{m - m'} + e^{σ - m'},
acc · e^{m - m'}) with m' = max(m, σ), so the row log-sum-exp includes the
sink and the backward's exp(s - lse) is the weights above unchanged. The
sink's gradient is -Σ_i w_i,sink · rowsum(dO ∘ O)_i: `sink_gradient`.
"""

import jax.numpy as jnp


def check_sinks(sinks, num_heads: int):
  """float32 `[H]` from `sinks` (None stays None); refuses another shape or a
  non-float dtype, naming it."""
  if sinks is None:
    return None
  dtype = getattr(sinks, 'dtype', None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f'sinks must be a float array [H] of logits, one per query head; got '
                    f'{type(sinks).__name__}' + (f' of {dtype}' if dtype is not None else '')
                    + '.')
  if sinks.shape != (num_heads,):
    raise ValueError(f'sinks has shape {tuple(sinks.shape)}: give [H] = ({num_heads},), '
                     'one logit per query head.')
  return jnp.asarray(sinks, jnp.float32)


def join_sink(m, l, acc, sink):
  """The running max `m` and normaliser `l` (`[..., q]` or `[..., q, 1]`) and
  unnormalised output `acc` `[..., q, Dv]` with the sink logit `sink`
  (broadcasting to `m`) joined to the denominator: the module docstring."""
  m_new = jnp.maximum(m, sink)
  correction = jnp.exp(m - m_new)
  l = l * correction + jnp.exp(sink - m_new)
  if acc.ndim == m.ndim:  # m [.., q, 1]: acc [.., q, Dv] broadcasts as it is
    return m_new, l, acc * correction
  return m_new, l, acc * correction[..., None]


def sink_gradient(sink, lse, delta):
  """d loss / d σ for each row: `-Σ_i exp(σ - lse_i) · delta_i` over the
  query axis (the last) of lse and delta = rowsum(dO ∘ O), float32."""
  return -jnp.sum(jnp.exp(sink[..., None] - lse) * delta, axis=-1)
