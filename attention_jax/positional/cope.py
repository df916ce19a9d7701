"""CoPE, contextual position encoding (Golovneva et al. 2024).

"Contextual Position Encoding: Learning to Count What's Important", arXiv
2405.18719. A position is not a token count but a count the *query* makes:
each key t it sees is counted by a gate in (0, 1), and key j sits at the sum
of the gates from j to the query. For head h, query i and key j (D the head
width, `visible` the keys the call's mask lets i attend to):

    g_it   = σ(q_i · k_t / √D) · visible_it                   gates
    p_ij   = Σ_{t >= j} g_it  (= Σ_{t = j … i} g_it, causal)    positions, fractional
    p_ij  <- min(p_ij, npos − 1)
    z_i[n] = q_i · e[:, n],  n = 0 … npos − 1                  logits at integer positions
    pos_ij = (1 − w) z_i[⌊p_ij⌋] + w z_i[⌈p_ij⌉],  w = p_ij − ⌊p_ij⌋
    score_ij = (q_i · k_j + pos_ij) / √D

e `[D, npos]` is the layer's position table, shared by its heads, zeros at
the start. No gradient flows through ⌊·⌋ and ⌈·⌉ (integer indices); it
flows through w (to the gates, hence q and k) and through z (to q and e).

Here CoPE is `score_contribution`: it reads the call's q `[B, T_q, H, D]`
and k `[B, T_k, H_kv, D]` (key/value heads repeated for grouped queries)
and returns `DenseBias(pos / √D)`, float32 `[B, H, T_q, T_k]`: the kernels
add a bias after scaling q·k by 1/√D, so pos/√D gives the score above. The
gates use `ScoreContext.visible()`, the mask the call applies (causal on
slots, sliding window, padding, the caller's mask): a query counts only the
keys it may attend to, so cached decoding (k the whole cache, the query at
its slot, later slots hidden) gives the positions of the full pass.

Cost. CoPE is O(T²) by nature: a gate on every q·k (computed here as well
as in the kernel), a cumulative sum over every row and a gather from
`[B, H, T_q, npos]`. It runs on the dense kernel; the chunked kernel
refuses a `DenseBias`, with an error naming 'the contextual positions of
cope', and implementation='auto' picks the dense kernel. Everything is
float32 whatever the dtype of q and k.

Matching the official code. github.com/facebookresearch/RAM,
projects/cope/src/cope/context_position.py, class `ContextPosSelfAttn`
(commit eff93c70), called from projects/cope/src/models/transformer.py
`MultiHeadAttn` with key_cope = key; tests/positional/test_cope.py transcribes its
forward and matches it. Paper and code differ; we follow the code:

* √D in the gates: the paper writes g_ij = σ(q_i · k_j); the code divides
  the logits by √D first. Ours: the code's.
* √D on the scores: the paper's softmax(q_i · (k_j + e[p_ij])) writes none;
  the code divides q·k + pos by √D (default) or, with `--cope-nodiv`, q·k
  only. Ours: the default; `nodiv=True` is the flag.
* Interpolation: the paper interpolates the vectors e[⌊p⌋], e[⌈p⌉] and
  takes q · e[p]; the code interpolates z_i = q_i · e at the integers, which
  is the same number (it is linear) and cheaper. Ours: the code's.
* npos: the paper clips p at p_max; the code clamps at npos − 1 with npos
  `--cope-npos`, default block_size + 1 ("position 0 is possible"). Ours:
  `npos`, default max_positions + 1 (a position is at most the number of
  keys, so nothing is clamped). With neither given it is an error naming
  both: the code always knows its block size, and a silent default would
  clamp every position past it (`TransformerLM` passes its max_positions).
* Keys past the query: the paper sums t = j … i; the code sums t >= j over
  the gates times its attention mask, the same under a causal mask. Ours:
  the code's sum with the call's mask.
* Not ported: `--cope-sep-key` (gates from a separate key projection: a
  projection of the attention module, not of the encoding), `--cope-val-gates`
  (gates from q·v: the encoding does not see v) and `--cope-layers` (CoPE
  every K layers, only with the code's 'cope+rel'). `--cope-shared` (one
  table for all layers) is `TransformerLM(encoding_per_layer=False)`; the
  default, one table per layer, is the code's (`per_layer = True`).
* Initialisation: e = 0, as in the code, so a new model starts as NoPE.

Bidirectional and cross-attention. The paper's models are causal decoders.
The code's encoder layers also run CoPE, with no causal mask, so a key's
position counts the gates from it to the *last* visible key; ours does the
same for `causal=False` and for cross-attention (queries not among the keys,
`q_slots` None): the formula needs only q, k and the mask. Scalable softmax,
if on, scales q before this hook, so the gates and z see the scaled q.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.attention.heads import repeat_kv_heads
from attention_jax.attention.scores import DenseBias
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.parameters import KV
from attention_jax.positional.parameters import param

# How kernels name this bias when they refuse it (the chunked kernel's
# error); "not linear in i - j" as every dense bias of the package says.
ORIGIN = ('the contextual positions of cope (O(T²) by nature: gates on every q·k), '
          'which are not linear in i - j')

# HIGHEST: f32 products on every backend (GPUs would otherwise use TF32).
_HIGHEST = jax.lax.Precision.HIGHEST


def cope_positions(gates: jnp.ndarray, visible: jnp.ndarray) -> jnp.ndarray:
  """Contextual positions `p_ij = Σ_{t >= j} gates_it · visible_it`.

  Args:
    gates: float `[..., T_q, T_k]`, each in [0, 1].
    visible: bool, broadcastable to `gates`: True where the query may attend.

  Returns:
    float32 `[..., T_q, T_k]` (the broadcast shape), unclamped; 0 where no
    visible key lies at or after j.
  """
  counted = jnp.where(visible, jnp.asarray(gates, jnp.float32), 0.0)
  return jax.lax.cumsum(counted, axis=counted.ndim - 1, reverse=True)


def cope_bias(q: jnp.ndarray, k: jnp.ndarray, pos_emb: jnp.ndarray,
              visible: jnp.ndarray, npos: int) -> jnp.ndarray:
  """`pos_ij` of the module docstring, not yet divided by √D.

  Args:
    q: queries `[B, T_q, H, D]`.
    k: keys `[B, T_k, H, D]` (heads already repeated for grouped queries).
    pos_emb: the position table e, float `[D, npos]`.
    visible: bool `[B|1, H|1, T_q, T_k]`, True = the query attends the key.
    npos: positions in the table; p is clamped to npos − 1.

  Returns:
    float32 `[B, H, T_q, T_k]`: the interpolated q · e[p_ij] (any value
    where `visible` is False: the mask hides it).
  """
  q = jnp.asarray(q, jnp.float32)
  k = jnp.asarray(k, jnp.float32)
  pos_emb = jnp.asarray(pos_emb, jnp.float32)
  gate_logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, precision=_HIGHEST)
  gates = jax.nn.sigmoid(gate_logits / np.sqrt(q.shape[-1]).astype(np.float32))
  positions = jnp.minimum(cope_positions(gates, visible), npos - 1)
  positions = jnp.broadcast_to(positions, gates.shape)
  fixed = jnp.einsum('bqhd,dn->bhqn', q, pos_emb, precision=_HIGHEST)  # z: [B, H, T_q, npos]
  # Integer indices: no gradient through ⌊p⌋, ⌈p⌉, as in the code. The
  # clamp keeps them in 0 … npos − 1 (p >= 0 always).
  floor = jnp.floor(positions)
  ceil_logits = jnp.take_along_axis(fixed, jnp.ceil(positions).astype(jnp.int32), axis=-1)
  floor_logits = jnp.take_along_axis(fixed, floor.astype(jnp.int32), axis=-1)
  ceil_weight = positions - jax.lax.stop_gradient(floor)  # differentiable in p
  return ceil_logits * ceil_weight + floor_logits * (1.0 - ceil_weight)


def _check_npos(npos, max_positions) -> int:
  if npos is None:
    if max_positions is None:
      raise ValueError('cope needs the size of its position table: npos (an integer >= 1, '
                       'the positions it holds; p is clamped to npos - 1) or max_positions '
                       '(npos = max_positions + 1, the official block_size + 1), e.g. '
                       "MultiHeadAttention(..., encoding='cope', max_positions=T) or "
                       "encoding_options={'npos': N}; TransformerLM passes its max_positions.")
    if isinstance(max_positions, bool) or not isinstance(max_positions, (int, np.integer)):
      raise ValueError(f'cope: max_positions={max_positions!r} must be an integer >= 0 '
                       '(npos defaults to max_positions + 1).')
    npos = max_positions + 1
  if isinstance(npos, bool) or not isinstance(npos, (int, np.integer)) or npos < 1:
    raise ValueError(f'cope: npos={npos!r} must be an integer >= 1 (positions in the '
                     'table; p is clamped to npos - 1).')
  return int(npos)


class CoPE(PositionalEncoding):
  """'cope': positions counted by gates σ(q·k/√D), a per-layer table e `[D, npos]`."""

  per_layer = True  # the official code gives each layer its own table (unless --cope-shared)

  def __init__(self, head_dim: int, npos: int, *, nodiv: bool = False):
    self.npos = npos  # static: the clamp and the table's size
    self.nodiv = nodiv  # static: True adds pos to q·k/√D undivided (--cope-nodiv)
    # Zeros, as in the official code: the model starts without position signal.
    self.pos_emb = param(jnp.zeros((head_dim, npos)), (KV, None))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs,
            npos: Optional[int] = None, nodiv: bool = False):
    """Options: `npos` (integer >= 1, the positions in the table; default
    max_positions + 1, the official block_size + 1; one of the two is
    required) and `nodiv` (the official `--cope-nodiv`: pos is added to
    the scores without the 1/√D; default False, the official default)."""
    del causal, rngs  # the same formula under any mask; zeros need no randomness
    if not isinstance(nodiv, (bool, np.bool_)):
      raise ValueError(f'cope: nodiv={nodiv!r} must be True or False.')
    npos = _check_npos(npos, max_positions)
    return cls(d_model // num_heads, npos, nodiv=bool(nodiv))

  def score_contribution(self, context: ScoreContext) -> DenseBias:
    """-> `DenseBias` float32 `[B, H, T_q, T_k]`: pos/√D (pos with `nodiv`)."""
    q, k = context.q, context.k
    if q.shape[-1] != self.pos_emb.shape[0]:
      raise ValueError(f'cope: head_dim {q.shape[-1]} of q {q.shape} differs from the '
                       f'table pos_emb {self.pos_emb.shape} [head_dim, npos].')
    k, _ = repeat_kv_heads(k, k, q.shape[2], q.shape)
    bias = cope_bias(q, k, self.pos_emb[...], context.visible(), self.npos)
    if not self.nodiv:
      bias = bias / np.sqrt(q.shape[-1]).astype(np.float32)
    return DenseBias(bias, origin=ORIGIN)
