"""Bahdanau (additive) and Luong (dot) attention for seq2seq decoders, lesson 7.1.

At decoder step i, with decoder state s_i and encoder states h_1 … h_T:

    e_ij = vᵀ tanh(W s_i + U h_j)        (additive, Bahdanau et al. 2015)
    e_ij = s_iᵀ h_j                      (dot, Luong et al. 2015)
    α_ij = softmax_j(e_ij)               over unpadded encoder positions
    c_i  = Σ_j α_ij h_j

`U h_j` does not depend on i, so callers project the encoder states once
(`keys_proj`) and reuse them at every decoder step. Shapes use `...` for any
leading batch axes; T is the number of encoder positions.
"""

from typing import Optional

import jax.numpy as jnp

from attention_jax.attention.checks import as_bool_mask
from attention_jax.attention.checks import check_array
from attention_jax.attention.dense import masked_softmax


def _queries_keys(query_name, query, keys_name, keys):
  """A query `[..., A]` and keys `[..., T, A]` with the same leading axes."""
  query = check_array(query_name, query, kind='floating')
  keys = check_array(keys_name, keys, kind='floating')
  if query.ndim < 1 or keys.ndim != query.ndim + 1 or (
      query.shape[:-1] != keys.shape[:-2] or query.shape[-1] != keys.shape[-1]):
    raise ValueError(f'{query_name} {tuple(query.shape)} and {keys_name} '
                     f'{tuple(keys.shape)} must be [..., A] and [..., T, A] (the same '
                     'leading axes and width).')
  return query, keys


def additive_scores(query_proj: jnp.ndarray, keys_proj: jnp.ndarray,
                    v: jnp.ndarray) -> jnp.ndarray:
  """`vᵀ tanh(W s + U h_j)`: query_proj `[..., A]` (= W s), keys_proj
  `[..., T, A]` (= U h), v `[A]` -> float32 scores `[..., T]`."""
  query_proj, keys_proj = _queries_keys('query_proj', query_proj, 'keys_proj', keys_proj)
  v = check_array('v', v, ndim=1, kind='floating')
  if v.shape != query_proj.shape[-1:]:
    raise ValueError(f'v must be [A={query_proj.shape[-1]}] (the projections\' width), got '
                     f'shape {tuple(v.shape)}.')
  hidden = jnp.tanh((query_proj[..., None, :] + keys_proj).astype(jnp.float32))
  return jnp.einsum('...ta,a->...t', hidden, v.astype(jnp.float32))


def dot_scores(query: jnp.ndarray, keys: jnp.ndarray) -> jnp.ndarray:
  """`sᵀ h_j`: query `[..., D]`, keys `[..., T, D]` -> float32 scores `[..., T]`."""
  query, keys = _queries_keys('query', query, 'keys', keys)
  return jnp.einsum('...d,...td->...t', query, keys, preferred_element_type=jnp.float32)


def attend(scores: jnp.ndarray, values: jnp.ndarray,
           mask: Optional[jnp.ndarray] = None) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Softmax over encoder positions and the weighted sum of values.

  Args:
    scores: `[..., T]`.
    values: `[..., T, D_v]` (the encoder states h).
    mask: optional boolean `[..., T]`, True = a real (unpadded) position.

  Returns:
    `(context [..., D_v]` in the dtype of `values`, `weights [..., T]` float32`)`:
    weights sum to 1 over unmasked positions and are exactly 0 on masked ones.
  """
  scores = check_array('scores', scores, kind='floating')
  values = check_array('values', values, kind='floating')
  if values.ndim != scores.ndim + 1 or scores.shape != values.shape[:-1]:
    raise ValueError(
        f'scores {scores.shape} and values {values.shape} disagree on the number '
        'of encoder positions or the leading axes (scores [..., T], values [..., T, D_v]).')
  if mask is not None:
    mask = as_bool_mask('mask', check_array('mask', mask))
    if mask.shape != scores.shape:
      raise ValueError(f'mask must be [..., T] as scores {tuple(scores.shape)}, got '
                       f'{tuple(mask.shape)}.')
  weights = masked_softmax(scores.astype(jnp.float32), mask)
  context = jnp.einsum('...t,...td->...d', weights, values,
                       preferred_element_type=jnp.float32)
  return context.astype(values.dtype), weights
