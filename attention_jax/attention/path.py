"""PaTH attention's scores (Yang et al., NeurIPS 2025, arXiv 2505.16381):
q·k transformed by a data-dependent product of Householder-like matrices.

    logit[i, j] = k_jᵀ H_{j+1} H_{j+2} … H_i q_i,     j <= i,
    H_s = I − β_s w_s w_sᵀ,   ‖w_s‖ = 1,   β_s ∈ (0, 2)

(H_s is symmetric, so this is also (H_i … H_{j+1} k_j)ᵀ q_i: the key carried
forward through every token after it up to the query.) With β = 0 it is
q_i·k_j; RoPE's fixed rotation is replaced by one read from the tokens.

The algorithm is the paper's (and FLA's `naive_path_attn`): cut the keys
into blocks of C tokens; within a block, the UT (compact WY) form of the
Householder product, T = (I + strictly_lower(diag(β) W Wᵀ))⁻¹, gives in
O(C² D) per block

* each key carried to its block's end, `k_local` (H_{j+1} … H_end k_j),
* each query carried back to its block's start, `q_local`,
* the scores within the block, `a_local`, and
* the block's whole product as a D × D update, `trans` (q ← q − q·trans),

and across blocks a query walks key blocks from its own backwards, scoring
`q'·k_local` and then moving q' across the block (`q' ← q' − q'·trans`).

Here: `householder_blocks` (the UT form per block), `path_logits` (the
dense logits of a full causal pass, O(T²) memory), `path_logits_at`
(queries at any cache slots: cached decoding), and the score spec
`HouseholderScores` through which an encoding hands them to attention.
The O(T) memory kernel is `path_blockwise.py`.

Layout: per-token arrays in Flax's order, q `[B, T_q, H, D]`, k `[B, T_k,
H_kv, D]`, w `[B, T_k, G, D]`, β `[B, T_k, G]`; H_kv and G divide H
(grouped-query attention: query head h reads key head h // (H / H_kv) and
transform head h // (H / G); FLA has G = H_kv). Logits are
float32 `[B, H, T_q, T_k]`, not scaled by 1/√D. All arithmetic is float32
at HIGHEST precision (the UT inverse is a triangular solve: TPUs' default
bf16 passes would lose it), whatever the input dtype.
"""

import dataclasses
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention.scores import ScoreSpec
from attention_jax.attention.scores import is_arange

# FLA's naive reference and kernels use blocks of 64 tokens.
BLOCK_SIZE = 64
HIGHEST = jax.lax.Precision.HIGHEST


def _mm(spec: str, *args):
  return jnp.einsum(spec, *args, precision=HIGHEST, preferred_element_type=jnp.float32)


def check_path_inputs(q, k, w, beta, origin: str = 'PaTH') -> None:
  """A ValueError naming the shapes unless q `[B, T_q, H, D]`, k `[B, T_k,
  H_kv, D]`, w `[B|1, T_k, G, D]`, β `[B|1, T_k, G]`, H_kv and G dividing H."""
  qs, ks, ws, bs = (tuple(jnp.shape(a)) for a in (q, k, w, beta))
  if (len(qs) != 4 or len(ks) != 4 or len(ws) != 4 or len(bs) != 3
      or ws[1] != ks[1] or ws[3] != ks[3] or bs != ws[:3] or ws[0] not in (1, ks[0])
      or ks[0] != qs[0] or ks[3] != qs[3] or min(ks[2], ws[2]) < 1
      or qs[2] % ks[2] or qs[2] % ws[2]):
    raise ValueError(f'{origin}: takes q [B, T_q, H, D], k [B, T_k, H_kv, D], w [B, T_k, G, '
                     f'D] and beta [B, T_k, G] (w and beta may have batch 1) with H_kv and G '
                     f'dividing H, got q {qs}, k {ks}, w {ws}, beta {bs}.')


def heads_first(x, num_heads: int) -> jnp.ndarray:
  """`[B, T, H_kv, ...]` -> float32 `[B, num_heads, T, ...]`, each key head
  repeated for its group of query heads."""
  x = jnp.moveaxis(jnp.asarray(x, jnp.float32), 2, 1)
  return jnp.repeat(x, num_heads // x.shape[1], axis=1) if x.shape[1] != num_heads else x


def block_size_for(t: int, block_size: Optional[int]) -> int:
  """The block length used for `t` keys: `block_size` (default BLOCK_SIZE),
  at most t; ValueError for a block size that is not an integer >= 1."""
  size = BLOCK_SIZE if block_size is None else block_size
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
    raise ValueError(f'PaTH: block_size={block_size!r} must be an integer >= 1 or None.')
  return int(max(1, min(size, t)))


def _blocks(x, c: int, axis: int = 2):
  """Pads the length axis to a multiple of c (zeros: w = 0, β = 0 is H = I)
  and splits it: [..., T, ...] -> [..., n, c, ...]."""
  t = x.shape[axis]
  pad = -t % c
  if pad:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    x = jnp.pad(x, widths)
  return x.reshape(*x.shape[:axis], (t + pad) // c, c, *x.shape[axis + 1:])


def unit_lower_inverse(lower: jnp.ndarray) -> jnp.ndarray:
  """(I + L)⁻¹ for L strictly lower triangular `[..., c, c]` (its upper part
  ignored), by recursive 2 × 2 block inversion: [[A, 0], [C, B]]⁻¹ = [[A⁻¹,
  0], [−B⁻¹ C A⁻¹, B⁻¹]]. The same arithmetic as forward substitution
  (stable, no powers of L), in O(log c) levels of batched matmuls: XLA:CPU's
  batched triangular solve was most of PaTH's time (benchmarks/path_attention.py)."""
  c = lower.shape[-1]
  if c == 1:
    return jnp.ones(lower.shape, jnp.float32)
  h = c // 2
  a = unit_lower_inverse(lower[..., :h, :h])
  b = unit_lower_inverse(lower[..., h:, h:])
  off = -_mm('...ij,...jk->...ik', b, _mm('...ij,...jk->...ik', lower[..., h:, :h], a))
  top = jnp.concatenate([a, jnp.zeros(a.shape[:-1] + (c - h,), jnp.float32)], -1)
  return jnp.concatenate([top, jnp.concatenate([off, b], -1)], -2)


def householder_blocks(k, w, beta, c: int) -> dict:
  """The UT form of each block's Householder product.

  Args:
    k, w: float32 `[B, H, T, D]` (heads first); β float32 `[B, H, T]`.
    c: block length.

  Returns:
    dict of float32 arrays, n = ceil(T / c) blocks: `w` `[B, H, n, c, D]`,
    `twb` (T·diag(β)·W) `[B, H, n, c, D]`, `twbk` (T · strictly_lower(β
    w·k)) `[B, H, n, c, c]`, `k_local` `[B, H, n, c, D]` and `trans` (Wᵀ·T·
    diag(β)·W, the block's product is I − transᵀ) `[B, H, n, D, D]`.
  """
  kb, wb = _blocks(k, c), _blocks(w, c)
  bb = _blocks(beta, c)[..., None]
  strict = jnp.tril(jnp.ones((c, c), bool), -1)
  bw = bb * wb
  lower = jnp.where(strict, _mm('...rd,...sd->...rs', bw, wb), 0.0)
  t_mat = unit_lower_inverse(lower)
  twb = _mm('...rs,...sd->...rd', t_mat, bw)
  twbk = _mm('...rs,...sj->...rj', t_mat,
             jnp.where(strict, _mm('...sd,...jd->...sj', bw, kb), 0.0))
  k_local = kb - _mm('...sj,...sd->...jd', twbk, wb)
  trans = _mm('...sd,...se->...de', wb, twb)
  return dict(w=wb, twb=twb, twbk=twbk, k_local=k_local, trans=trans)


def local_queries(q, k, prep: dict, c: int):
  """Queries of a full pass (query i at key slot i), carried back to their
  block's start, and the scores inside each block.

  q, k: float32 `[B, H, T, D]`. Returns (q_local `[B, H, n, c, D]`, a_local
  `[B, H, n, c, c]`, valid where key <= query)."""
  qb, kb = _blocks(q, c), _blocks(k, c)
  lower = jnp.tril(jnp.ones((c, c), bool))
  qw = jnp.where(lower, _mm('...rd,...sd->...rs', qb, prep['w']), 0.0)
  q_local = qb - _mm('...rs,...sd->...rd', qw, prep['twb'])
  a_local = _mm('...rd,...jd->...rj', qb, kb) - _mm('...rs,...sj->...rj', qw, prep['twbk'])
  return q_local, a_local


def across(q_prime, prep: dict, c_idx):
  """One step back across key blocks: scores of q' against the keys of block
  c_idx (carried to its end) and q' moved across that block.

  q_prime `[B, H, ..., c_q, D]`, c_idx an int index (or int array matching
  the `...` axes) into the n blocks. Returns (scores `[B, H, ..., c_q, c]`,
  the new q')."""
  take = lambda a: jnp.take(a, c_idx, axis=2)
  scores = _mm('...rd,...jd->...rj', q_prime, take(prep['k_local']))
  return scores, q_prime - _mm('...rd,...de->...re', q_prime, take(prep['trans']))


def path_logits(q, k, w, beta, *, block_size: Optional[int] = None) -> jnp.ndarray:
  """The PaTH logits of a full causal pass (query i at key slot i), dense.

  Args:
    q: queries `[B, T, H, D]`.
    k: keys `[B, T, H_kv, D]`.
    w: unit Householder directions `[B|1, T, G, D]`, G dividing H.
    beta: β in (0, 2) (any real works) `[B|1, T, G]`.
    block_size: the block length of the UT form (default 64); the result
      does not depend on it beyond float32 rounding.

  Returns:
    float32 `[B, H, T, T]`: k_jᵀ H_{j+1} … H_i q_i for j <= i, 0 above the
    diagonal (masked by the caller). O(T²) memory, O(T² D) work.
  """
  check_path_inputs(q, k, w, beta, 'path_logits')
  if q.shape[1] != k.shape[1]:
    raise ValueError(f'path_logits: a full causal pass has T_q == T_k, got {q.shape[1]} '
                     f'and {k.shape[1]}; for queries at other slots use path_logits_at.')
  h, t = q.shape[2], q.shape[1]
  c = block_size_for(t, block_size)
  qf, kf = heads_first(q, h), heads_first(k, h)
  prep = householder_blocks(kf, heads_first(w, h), heads_first(beta, h), c)
  q_local, a_local = local_queries(qf, kf, prep, c)
  n = q_local.shape[2]
  blocks = jnp.arange(n)
  lower = jnp.tril(jnp.ones((c, c), bool))
  grid = jnp.where(lower, a_local, 0.0)[:, :, :, :, None, :] * jnp.eye(n)[:, None, :, None]
  if n > 1:
    def step(q_prime, d):
      # Query block b meets key block b - d (clipped; masked below for b < d).
      scores, moved = across(q_prime, prep, jnp.clip(blocks - d, 0))
      return jnp.where((blocks >= d)[:, None, None], moved, q_prime), scores

    _, scores = jax.lax.scan(step, q_local, jnp.arange(1, n))  # [n-1, B, H, n, c, c]
    # grid[b, c] for c < b is scores[b - c - 1][b].
    d_idx = jnp.clip(blocks[:, None] - blocks[None, :] - 1, 0, n - 2)
    off = jnp.moveaxis(scores, 0, 3)[:, :, blocks[:, None], d_idx]  # [B, H, n, n, c, c]
    off = jnp.where((blocks[:, None] > blocks[None, :])[:, :, None, None], off, 0.0)
    grid = grid + jnp.swapaxes(off, 3, 4)
  logits = grid.reshape(*grid.shape[:2], n * c, n * c)
  return logits[..., :t, :t]


def path_logits_at(q, k, w, beta, q_slots, *, block_size: Optional[int] = None):
  """The PaTH logits of queries at any key slots (cached decoding, a prompt
  appended to a cache): query i, at slot p_i, against every key j <= p_i.

  Args:
    q: queries `[B, T_q, H, D]`.
    k, w, beta: as `path_logits`, over `T_k` key slots.
    q_slots: int `[T_q]`, each query's slot among the keys (0 … T_k - 1).
    block_size: as `path_logits`.

  Returns:
    float32 `[B, H, T_q, T_k]`; entries j > p_i are 0 (masked by the
    caller). Only tokens at slots <= p_i enter query i's logits, so slots
    written later (or holding stale tokens) change nothing. O(T_q · T_k · D)
    memory: meant for few queries.
  """
  check_path_inputs(q, k, w, beta, 'path_logits_at')
  h, t_k = q.shape[2], k.shape[1]
  c = block_size_for(t_k, block_size)
  kf = heads_first(k, h)
  prep = householder_blocks(kf, heads_first(w, h), heads_first(beta, h), c)
  n = prep['w'].shape[2]
  slots = jnp.asarray(q_slots, jnp.int32)
  b_i, r_i = slots // c, slots % c
  qf = heads_first(q, h)  # [B, H, T_q, D]
  own = lambda a: jnp.take(a, b_i, axis=2)  # each query's own block: [B, H, T_q, ...]
  upto = jnp.arange(c)[None, :] <= r_i[:, None]  # [T_q, c]: tokens s <= p_i in the block
  qw = jnp.where(upto, _mm('bhqd,bhqsd->bhqs', qf, own(prep['w'])), 0.0)
  q_prime = qf - _mm('bhqs,bhqsd->bhqd', qw, own(prep['twb']))
  local = (_mm('bhqd,bhqjd->bhqj', qf, own(_blocks(kf, c)))
           - _mm('bhqs,bhqsj->bhqj', qw, own(prep['twbk'])))
  grid = jnp.where((jnp.arange(n)[None, :] == b_i[:, None])[:, :, None],
                   jnp.where(upto, local, 0.0)[:, :, :, None, :], 0.0)  # [B, H, T_q, n, c]

  def step(q_prime, d):
    c_idx = jnp.clip(b_i - d, 0)
    scores = _mm('bhqd,bhqjd->bhqj', q_prime, jnp.take(prep['k_local'], c_idx, axis=2))
    moved = q_prime - _mm('bhqd,bhqde->bhqe', q_prime, jnp.take(prep['trans'], c_idx, axis=2))
    return jnp.where((b_i >= d)[:, None], moved, q_prime), scores

  if n > 1:
    _, scores = jax.lax.scan(step, q_prime, jnp.arange(1, n))  # [n-1, B, H, T_q, c]
    blocks = jnp.arange(n)
    d_idx = jnp.clip(b_i[:, None] - blocks[None, :] - 1, 0, n - 2)  # [T_q, n]
    off = jnp.moveaxis(scores, 0, 3)  # [B, H, T_q, n-1, c]
    off = jnp.take_along_axis(off, jnp.broadcast_to(d_idx[None, None, :, :, None],
                                                    off.shape[:3] + (n, c)), axis=3)
    grid = grid + jnp.where((blocks[None, :] < b_i[:, None])[:, :, None], off, 0.0)
  return grid.reshape(*grid.shape[:3], n * c)[..., :t_k]


@dataclasses.dataclass(frozen=True, eq=False)
class HouseholderScores(ScoreSpec):
  """PaTH's transform of the scores: q_i·k_j is replaced by k_jᵀ H_{j+1} … H_i
  q_i (module docstring), i the query's key slot. Not an additive bias of
  its own: its `dense` form is the difference (transformed − plain)/√D, so
  any kernel that adds a materialised bias to q·k/√D (dense, cuDNN, TPU
  flash) computes PaTH exactly, and a kernel that builds it block by block
  (`path_blockwise`) reads q, k, w and β.

  q `[B, T_q, H, D]` and k `[B, T_k, H_kv, D]`: the call's (the scores are
  theirs); w `[B|1, T_k, G, D]` unit vectors, beta `[B|1, T_k, G]`;
  q_slots int `[T_q]` each query's key slot, or None for a full causal pass
  (query i at slot i, T_q == T_k); block_size the UT form's block (None:
  64).
  """
  kind: ClassVar[str] = 'a Householder transform of q·k (PaTH)'
  q: jnp.ndarray
  k: jnp.ndarray
  w: jnp.ndarray
  beta: jnp.ndarray
  q_slots: Optional[jnp.ndarray] = None
  block_size: Optional[int] = None
  origin: Optional[str] = None

  def __post_init__(self):
    check_path_inputs(self.q, self.k, self.w, self.beta,
                      'HouseholderScores' + (f' (from {self.origin})' if self.origin else ''))
    if self.q_slots is None and self.q.shape[1] != self.k.shape[1]:
      raise ValueError(f'HouseholderScores without q_slots is a full causal pass (T_q == '
                       f'T_k), got T_q={self.q.shape[1]}, T_k={self.k.shape[1]}: give each '
                       'query\'s key slot as q_slots.')
    block_size_for(1, self.block_size)

  def check(self, b, h, t_q, t_k):
    q, k = jnp.shape(self.q), jnp.shape(self.k)
    if q[0] != b or q[2] != h or q[1] != t_q or k[1] != t_k:
      raise ValueError(f'a HouseholderScores of q {q} and k {k}'
                       f'{" (from " + self.origin + ")" if self.origin else ""} for B={b}, '
                       f'H={h}, T_q={t_q}, T_k={t_k}: its q and k must be the call\'s.')

  @property
  def full_pass(self) -> bool:
    """Whether query i sits at key slot i for every i (T_q == T_k)."""
    return self.q_slots is None or (is_arange(self.q_slots)
                                    and len(self.q_slots) == self.k.shape[1])

  def logits(self) -> jnp.ndarray:
    """The transformed logits, float32 `[B, H, T_q, T_k]` (unscaled)."""
    if self.full_pass:
      return path_logits(self.q, self.k, self.w, self.beta, block_size=self.block_size)
    return path_logits_at(self.q, self.k, self.w, self.beta, self.q_slots,
                          block_size=self.block_size)

  def dense(self, t_q=None, t_k=None):
    del t_q, t_k  # q's and k's own lengths
    h = self.q.shape[2]
    plain = _mm('bhqd,bhkd->bhqk', heads_first(self.q, h), heads_first(self.k, h))
    return (self.logits() - plain) * (1.0 / np.sqrt(self.q.shape[-1]))
