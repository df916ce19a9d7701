"""Multi-Token Attention's key-query convolution (Golovneva et al. 2025).

"Multi-Token Attention", arXiv 2504.00927. Each attention logit is a
learned 2-D convolution of the q·k scores around it, over earlier queries
and nearby keys, so one weight can say "these few tokens, in this order,
match those": a lookup of a whole n-gram in one head, with no positions.
For head h, query i, key j (S the scaled scores, zero where masked):

    S[i, j]   = q_i · k_j / √D            if key j is visible to query i, else 0
    S'[i, j]  = Σ_{r < c_q, c < c_k} θ_h[r, c] · S[i − (c_q − 1 − r), j + c − left]
    logits    = S'[i, j]  at visible (i, j); masked as usual elsewhere

with `left` = (c_k − 1) / 2 (keys padded on both sides), c_k − 1 (left: only
earlier keys) or 0 (right), and entries outside the sequence zero. Every
score the convolution reads belongs to a query at or before i and a key it
may see, so nothing after query i reaches it: causal as the mask says.

Matching the official code (facebookresearch/RAM, projects/mta/
mta_transformer.py, `Attention._mta_convolution`, commit 85d44f05): masked
scores set to 0, `F.conv2d` of the scores padded by (c_q − 1, 0) on the
queries and by `pad_key` on the keys, kernel `[H, 1, c_q, c_k]` (one per
head and layer), then the mask and the softmax; `init_method='identity'`
(θ = 1 at the current query and key, 0 elsewhere: plain attention at the
start). Defaults are its configs' c_q = 6, c_k = 11, pad_key 'both'. Here
the kernel's θ is `[H, c_q, c_k]`, its layout without the channel axis.

Not ported: the rest of the official MTA block (the head-mixing and
post-softmax convolutions, the group norm and its gate, RoPE on q and k):
this is the key-query convolution on NoPE scores, the part that matches
several tokens at once. The same scores are recomputed here (the kernel
computes them too) and the contribution is `S' − S`, so the kernel's logits
are S'.

Cost: c_q score matrices `[B, H, T_q, T_k]` and c_q · c_k shifted copies:
O(T²) by nature, dense kernel only (a `DenseBias`). Cached decoding reads
the queries of the c_q − 1 slots before each query from the cache
(`reads_query_history`), so it gives the bias of the full pass. Causal
self-attention only; a sliding window, padding and a caller's mask (over
every slot) hide from each earlier query's row what they hide from it.
"""

from typing import Optional

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.scores import DenseBias
from attention_jax.attention.segments import segment_mask
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.dape import dape_scores
from attention_jax.positional.parameters import HEADS
from attention_jax.positional.parameters import param

PAD_KEY = ('both', 'left', 'right')
ORIGIN = "the key-query convolution of mta"


def left_padding(key_kernel_size: int, pad_key: str) -> int:
  """Key offsets read: key j sees scores at keys j - left … j - left + c_k - 1."""
  return {'both': (key_kernel_size - 1) // 2, 'left': key_kernel_size - 1, 'right': 0}[pad_key]


def identity_kernel(num_heads: int, query_kernel_size: int, key_kernel_size: int,
                    pad_key: str) -> np.ndarray:
  """float32 `[H, c_q, c_k]`: 1 at (the current query, the same key), 0 elsewhere."""
  theta = np.zeros((num_heads, query_kernel_size, key_kernel_size), np.float32)
  theta[:, -1, left_padding(key_kernel_size, pad_key)] = 1.0
  return theta


def _shift_keys(scores: jnp.ndarray, shift: int) -> jnp.ndarray:
  """out[..., j] = scores[..., j + shift], zero outside `[0, T_k)`."""
  t_k = scores.shape[-1]
  if shift == 0:
    return scores
  if abs(shift) >= t_k:
    return jnp.zeros_like(scores)
  pad = [(0, 0)] * (scores.ndim - 1)
  if shift > 0:
    return jnp.pad(scores[..., shift:], pad + [(0, shift)])
  return jnp.pad(scores[..., :shift], pad + [(-shift, 0)])


def key_query_convolution(theta: jnp.ndarray, q_history: jnp.ndarray, k: jnp.ndarray,
                          q_slots, *, pad_key: str = 'both',
                          kv_lengths: Optional[jnp.ndarray] = None,
                          window: Optional[int] = None,
                          mask: Optional[jnp.ndarray] = None,
                          segment_ids=None) -> jnp.ndarray:
  """S' of the module docstring for the queries at `q_slots`.

  Args:
    theta: float32 `[H, c_q, c_k]`.
    q_history: queries of every slot `[B, T_k, H, D]`, slot-aligned with k.
    k: keys `[B, T_k, H_kv, D]`.
    q_slots: int `[T_q]`, the slots of the queries scored.
    pad_key: 'both' | 'left' | 'right'.
    kv_lengths: int `[B]`: keys at index >= kv_lengths[b] are padding.
    window: a sliding window (slot - key < window), or None.
    mask: a caller's boolean mask `[B|1, H|1, T_k, T_k]` over slots × keys (a
      full pass: each earlier query's row is read from it), or None.
    segment_ids: None, or int (the ids of the queries at each slot `[B,
      T_k]`, the keys' `[B, T_k]`) of a packed row (a full pass): for query
      i, the scores it reads whose earlier query or key lies outside i's
      document are 0, as if the document were alone (the key shift would
      otherwise carry a neighbour document's own scores into it).

  Returns:
    float32 `[B, H, T_q, T_k]`.
  """
  h, c_q, c_k = theta.shape
  t_k = k.shape[1]
  left = left_padding(c_k, pad_key)
  slots = jnp.asarray(q_slots, jnp.int32)
  keys = jnp.arange(t_k, dtype=jnp.int32)[None, :]
  out = jnp.zeros((q_history.shape[0], h, slots.shape[0], t_k), jnp.float32)
  for r in range(c_q):
    rows = slots - (c_q - 1 - r)  # the earlier query this kernel row reads
    q_rows = jnp.take(q_history, jnp.clip(rows, 0, t_k - 1), axis=1)
    visible = (keys <= rows[:, None]) & (rows[:, None] >= 0)  # [T_q, T_k]
    if window is not None:
      visible = visible & (rows[:, None] - keys < window)
    visible = visible[None, None]
    if mask is not None:
      visible = visible & jnp.take(mask, jnp.clip(rows, 0, t_k - 1), axis=-2)
    if kv_lengths is not None:
      visible = visible & (keys < jnp.asarray(kv_lengths)[:, None])[:, None, None, :]
    if segment_ids is not None:  # the earlier query and the key in query i's document
      row_ids = jnp.take(segment_ids[0], jnp.clip(rows, 0, t_k - 1), axis=1)
      own = jnp.take(segment_ids[0], slots, axis=1)  # [B, T_q]
      visible = visible & segment_mask(own, segment_ids[1]) & (row_ids == own)[:, None, :, None]
    scores = jnp.where(visible, dape_scores(q_rows, k), 0.0)  # [B, H, T_q, T_k]
    for c in range(c_k):
      out = out + theta[None, :, r, c, None, None] * _shift_keys(scores, c - left)
  return out


class MultiTokenAttention(PositionalEncoding):
  """'mta': NoPE scores convolved over earlier queries and nearby keys."""

  per_layer = True  # one kernel per layer, as the official code
  reads_query_history = True

  def __init__(self, num_heads: int, query_kernel_size: int, key_kernel_size: int,
               pad_key: str):
    self.num_heads = num_heads
    self.pad_key = pad_key  # static
    self.kernel = param(identity_kernel(num_heads, query_kernel_size, key_kernel_size,
                                        pad_key), (HEADS, None, None))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            query_kernel_size: int = 6, key_kernel_size: int = 11, pad_key: str = 'both'):
    """Options: `query_kernel_size` c_q (queries read: this one and c_q − 1
    before it; default 6), `key_kernel_size` c_k (keys read around each;
    default 11, odd with pad_key='both'), `pad_key` ('both', 'left': earlier
    keys only, 'right'). The kernel starts as the identity (plain NoPE)."""
    del d_model, max_positions, rngs
    for name, value in (('query_kernel_size', query_kernel_size),
                        ('key_kernel_size', key_kernel_size)):
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'mta: {name}={value!r} must be an integer >= 1.')
    if pad_key not in PAD_KEY:
      raise ValueError(f'mta: pad_key={pad_key!r}; choose one of {PAD_KEY}.')
    if pad_key == 'both' and key_kernel_size % 2 == 0:
      raise ValueError(f"mta: key_kernel_size={key_kernel_size} must be odd with "
                       "pad_key='both' (as many keys on each side), or use 'left'/'right'.")
    if not causal:
      raise ValueError('mta: the key-query convolution is causal (it reads earlier '
                       'queries); causal=False is not supported.')
    return cls(num_heads, int(query_kernel_size), int(key_kernel_size), pad_key)

  def score_contribution(self, context: ScoreContext) -> DenseBias:
    """-> `DenseBias` float32 `[B, H, T_q, T_k]`: S' − S (the kernel adds S)."""
    if context.q.shape[2] != self.num_heads:
      raise ValueError(f'mta: built for {self.num_heads} heads, but q {context.q.shape} '
                       f'[B, T_q, H, D] has {context.q.shape[2]}.')
    if context.q_slots is None or context.q_history is None:
      raise ValueError('mta: needs causal self-attention (queries that are keys, and their '
                       'history); cross-attention is not supported.')
    if context.mask is not None and context.mask.shape[-2] != context.k.shape[1]:
      raise ValueError(f'mta: a caller mask must cover every slot (rows = keys = '
                       f'{context.k.shape[1]}), got {context.mask.shape}: the convolution '
                       'reads the rows of earlier queries.')
    segments = None
    if context.q_segment_ids is not None:
      # The convolution reads the queries of earlier slots (`q_history`, one
      # per key slot): their documents are the keys' (self-attention), also
      # over a cache, where the call's queries are a few of those slots.
      full = context.q_segment_ids.shape[1] == context.k.shape[1]
      segments = ((context.q_segment_ids if full else context.k_segment_ids),
                  context.k_segment_ids)
    convolved = key_query_convolution(
        self.kernel[...].astype(jnp.float32), context.q_history, context.k, context.q_slots,
        pad_key=self.pad_key, kv_lengths=context.kv_lengths, window=context.window,
        mask=context.mask, segment_ids=segments)
    return DenseBias(convolved - dape_scores(context.q, context.k), origin=ORIGIN)
