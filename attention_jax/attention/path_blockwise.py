"""PaTH attention block by block, in O(T) memory: the 'path_blockwise' kernel.

The paper's chunked algorithm (`path.py`'s module docstring) with an online
softmax, as FlashAttention: each query block starts from its own block
(`q_local`, the in-block scores `a_local`) and walks the key blocks before
it, newest first, scoring against the keys carried to their block's end
(`k_local`) and then moving its queries across that block (q' ← q' −
q'·trans). No T × T array exists: the UT forms are O(T · (C + D)) numbers,
one query block's walk O(C · (C + D)).

Gradients are JAX's own, with each query block's walk rematerialised
(`jax.checkpoint` around the block inside `lax.map`): the forward keeps
nothing per block, and the backward of one block re-runs its walk, so the
peak stays O(T · (C + D)) per example and head rather than the O(T² D / C)
that differentiating the walks directly would store. On the project's CPU it
is also the faster of the two (`rematerialize=False` keeps the walks;
`benchmarks/path_attention.py` times both): the stored walks cost more
memory traffic than the re-run costs arithmetic. A hand-written backward (as
FLA's Triton kernels have) is not built.

A forget gate (PaTH-FoX) comes as a `DifferenceBias`: q_values[i] −
k_values[j] added to the scaled scores (FLA adds the gate before scaling:
the encoding scales the values, `positional/path.py`).

Shapes: q `[B, T, H, D]`, k `[B, T, H_kv, D]`, v `[B, T, H_kv, D_v]`, w `[B|1,
T, G, D]`, β `[B|1, T, G]` (H_kv and G dividing H), out `[B, T, H, D_v]` in
v's dtype.
Arithmetic in float32 (scores, softmax, the Householder transforms).
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention.path import HouseholderScores
from attention_jax.attention.path import _blocks
from attention_jax.attention.path import _mm
from attention_jax.attention.path import block_size_for
from attention_jax.attention.path import check_path_inputs
from attention_jax.attention.path import heads_first
from attention_jax.attention.path import householder_blocks
from attention_jax.attention.path import local_queries
from attention_jax.attention.scores import MASK_VALUE
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import one_of_each

# 'auto' takes this kernel for PaTH from this many keys on (below, the dense
# kernel); benchmarks/path_attention.py measures both.
AUTO_MIN_KEYS = 256


def _gate_rows(values, h: int, c: int):
  """`[B|1, T, H]` -> float32 `[B|1, H, n, c]` (zeros past T)."""
  values = jnp.moveaxis(jnp.asarray(values, jnp.float32), -1, 1)
  if values.shape[1] != h:
    raise ValueError(f'path_attention: gate values need one per query head ({h}), got '
                     f'{values.shape[1]}.')
  return _blocks(values, c)


def path_attention(q, k, v, w, beta, gate=None, *, kv_lengths=None,
                   block_size: Optional[int] = None,
                   rematerialize: bool = True) -> jnp.ndarray:
  """Causal PaTH attention, O(T) memory (module docstring).

  Args:
    q: queries `[B, T, H, D]`.
    k: keys `[B, T, H_kv, D]`, H_kv dividing H.
    v: values `[B, T, H_kv, D_v]`.
    w: unit Householder directions `[B|1, T, G, D]`, G dividing H.
    beta: `[B|1, T, G]`, in (0, 2) for PaTH (any real is computed).
    gate: None, cumulative log gates c `[B|1, T, H]` (c_i − c_j is added to
      the scaled scores), or a pair (q_values, k_values) of those.
    kv_lengths: int `[B]`: keys at index >= kv_lengths[b] are padding.
    block_size: tokens per block (default 64, at most T).
    rematerialize: re-run each query block's walk in the backward pass
      (O(T) memory) rather than store it (module docstring).

  Returns:
    `[B, T, H, D_v]` in the dtype of v.
  """
  check_path_inputs(q, k, w, beta, 'path_attention')
  if not isinstance(rematerialize, bool):
    raise TypeError(f'path_attention: rematerialize must be True or False, got '
                    f'{rematerialize!r}.')
  b, t, h, d = q.shape
  if v.ndim != 4 or v.shape[:3] != k.shape[:3]:
    raise ValueError(f'path_attention: v must be [B, T, H_kv, D_v] like k {k.shape}, got '
                     f'{v.shape}.')
  if k.shape[1] != t:
    raise ValueError(f'path_attention is causal self-attention: T_q == T_k, got {t} and '
                     f'{k.shape[1]}.')
  c = block_size_for(t, block_size)
  qf, kf, vf = heads_first(q, h), heads_first(k, h), heads_first(v, h)
  prep = householder_blocks(kf, heads_first(w, h), heads_first(beta, h), c)
  q_local, a_local = local_queries(qf, kf, prep, c)
  n = q_local.shape[2]
  vb = _blocks(vf, c)  # [B, H, n, c, D_v]
  if gate is None:
    gq = gk = jnp.zeros((1, h, n, c), jnp.float32)
  else:
    q_values, k_values = gate if isinstance(gate, (tuple, list)) else (gate, gate)
    gq, gk = _gate_rows(q_values, h, c), _gate_rows(k_values, h, c)
  slot = jnp.arange(n * c).reshape(n, c)
  valid = (slot < t)[None, None]  # [1, 1, n, c]: keys that exist
  if kv_lengths is not None:
    valid = valid & (slot[None] < jnp.asarray(kv_lengths)[:, None, None])[:, None]
  scale = 1.0 / np.sqrt(d)
  tril = jnp.tril(jnp.ones((c, c), bool))
  at = lambda a, i: jax.lax.dynamic_index_in_dim(a, i, axis=2, keepdims=False)

  def update(carry, scores, keep, values):
    m, l, acc = carry
    scores = jnp.where(keep, scores, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(scores, -1))
    p = jnp.where(keep, jnp.exp(scores - m_new[..., None]), 0.0)
    alpha = jnp.exp(m - m_new)
    return (m_new, l * alpha + jnp.sum(p, -1),
            acc * alpha[..., None] + _mm('...qk,...kd->...qd', p, values))

  # The key blocks newest first, then n - 1 blocks of zeros: query block i
  # reads blocks i - 1, i - 2, … as one slice of n - 1 from row n - i (rows
  # past block 0 are masked). One slice per query block, whose gradient is
  # one update, where indexing per step would scatter into the whole array.
  newest_first = lambda a: jnp.concatenate(
      [jnp.flip(a, 2), jnp.zeros(a.shape[:2] + (n - 1,) + a.shape[3:], a.dtype)], 2)
  earlier = [newest_first(a) for a in (prep['k_local'], prep['trans'], vb,
                                       jnp.broadcast_to(gk, gk.shape), valid)]

  def query_block(i):
    g_i = at(gq, i)[..., :, None]
    start = (jnp.full(g_i.shape[:-1], MASK_VALUE, jnp.float32),
             jnp.zeros(g_i.shape[:-1], jnp.float32),
             jnp.zeros(g_i.shape[:-1] + (vb.shape[-1],), jnp.float32))
    stats = update(start, at(a_local, i) * scale + g_i - at(gk, i)[..., None, :],
                   tril & at(valid, i)[..., None, :], at(vb, i))

    def step(carry, block):
      q_prime, stats = carry
      back, k_j, trans_j, v_j, g_j, valid_j = block  # key block j = i - back
      scores = _mm('...rd,...jd->...rj', q_prime, k_j)
      keep = (i >= back) & valid_j[..., None, :]
      stats = update(stats, scores * scale + g_i - g_j[..., None, :], keep, v_j)
      moved = q_prime - _mm('...rd,...de->...re', q_prime, trans_j)
      return (jnp.where(i >= back, moved, q_prime), stats), None

    if n > 1:
      blocks = [jnp.moveaxis(jax.lax.dynamic_slice_in_dim(a, n - i, n - 1, axis=2), 2, 0)
                for a in earlier]
      (_, stats), _ = jax.lax.scan(step, (at(q_local, i), stats),
                                   (jnp.arange(1, n), *blocks))
    _, l, acc = stats
    return jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)

  walk = jax.checkpoint(query_block) if rematerialize else query_block
  out = jax.lax.map(walk, jnp.arange(n))  # [n, B, H, c, D_v]
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * c, -1)[:, :, :t]
  return jnp.swapaxes(out, 1, 2).astype(v.dtype)


def path_blockwise_kernel(q, k, v, *, mask, scores, causal, window, kv_lengths,
                          normalization=None, q_slots=None, return_weights=False,
                          chunk_size=None, **unused_options):
  """The 'path_blockwise' row of `dispatch.KERNELS`: causal, at most one
  `HouseholderScores` of a full pass and one `DifferenceBias`, kv_lengths;
  softmax. Its block is the spec's `block_size`, else `chunk_size`, else 64.
  -> (out, None)."""
  del unused_options, return_weights, window, normalization, q_slots, mask, causal
  transform, difference = one_of_each(scores, (HouseholderScores, DifferenceBias),
                                      'path_blockwise')
  if transform is not None and not transform.full_pass:
    raise ValueError('path_blockwise serves a full causal pass (query i at key slot i); '
                     'this HouseholderScores has other q_slots: use the dense kernel.')
  h_kv = k.shape[2]
  if transform is None:  # β = 0: every H is the identity
    w = jnp.zeros((1,) + k.shape[1:], jnp.float32)
    beta = jnp.zeros((1, k.shape[1], h_kv), jnp.float32)
    block = chunk_size
  else:
    w, beta = transform.w, transform.beta
    block = transform.block_size if transform.block_size is not None else chunk_size
  gate = None if difference is None else (difference.q_values, difference.k_values)
  return path_attention(q, k, v, w, beta, gate, kv_lengths=kv_lengths,
                        block_size=block), None
