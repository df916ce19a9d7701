"""Coupled position ids (position coupling, Cho et al. 2024, arXiv 2405.20671).

Each output token gets the position id of the input token it is computed
from, so one fixed id offset finds the input to copy at every length: the
ids that `windowed_rope` (with a sink) reads in the headline recipe. For
`BOS x_1 … x_n SEP y_1 … y_m EOS` (m = output_factor · n), offset s:

    BOS, EOS, padding -> 0
    x_i               -> s + i
    SEP, y_1 … y_{m-1} -> one step (in reading order: -1 forwards, +1
                          backwards) before the id of the input their
                          successor reads: the token predicting y_{k+1}
                          sits next to x_src(k+1)
    y_m               -> s + src(m) (it predicts EOS)

`src` comes from the task's rule, applied to the index array 0 … N-1 instead
of symbols, so the ids always agree with the rule. For copy and reverse this
is "y_k gets x_src(k)'s id"; for duplicate it differs at y_n, which takes
SEP's id so that the second copy starts as the first did. The lab's tasks
(`attention_jax.lab.tasks.coupling`) document the derivation and its match
with the official code.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

Rule = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def reads_forward(rule: Rule) -> bool:
  """Whether `rule`'s first output reads x_1 (copy, duplicate) rather than
  x_n (reverse), decided on a two-symbol example at trace time."""
  with jax.ensure_compile_time_eval():
    src = rule(jnp.arange(2, dtype=jnp.int32)[None], jnp.array([2], jnp.int32),
               jnp.zeros((1, 1), jnp.int32))
    return int(np.asarray(src)[0, 0]) == 0


def coupled_position_ids(rule: Rule, lengths: jax.Array, total: int, offset,
                         *, output_factor: int = 1) -> jax.Array:
  """Coupled position ids for `BOS x SEP y EOS` rows (module docstring).

  Args:
    rule: `rule(x [B, N], lengths [B], j [B, T]) -> [B, T]`, output token j
      (0-based) of each row as a function of its input symbols x: e.g. copy
      is `jnp.take_along_axis(x, j, 1)`, reverse reads `lengths - 1 - j`.
    lengths: int `[B]`, input lengths n.
    total: tokens per row T (the full sequence: BOS, n inputs, SEP, m
      outputs, EOS, padding); n <= (T - 3) // (1 + output_factor).
    offset: int scalar or `[B]`, the ids' shift s (>= 1; training draws it
      at random so that every id is trained, evaluation uses 1).
    output_factor: m = output_factor · n.

  Returns:
    int32 `[B, total]`, to pass as `positions=` to the model.
  """
  if total < 3 + 1 + output_factor:
    raise ValueError(f'coupled_position_ids: total={total} holds no example (BOS, SEP, EOS '
                     f'and one input with its {output_factor} output(s)).')
  lengths = jnp.asarray(lengths, jnp.int32)
  n = lengths[:, None]
  m = output_factor * n
  max_n = (total - 3) // (1 + output_factor)
  b = lengths.shape[0]
  p = jnp.arange(total, dtype=jnp.int32)[None, :]
  index = jnp.broadcast_to(jnp.arange(max_n, dtype=jnp.int32)[None], (b, max_n))
  last = output_factor * max_n - 1
  src = lambda j: rule(index, lengths, jnp.broadcast_to(jnp.clip(j, 0, last), (b, total)))
  step = 1 if reads_forward(rule) else -1
  q = p - n - 1  # the output that slot p's token predicts
  slot = jnp.select([p == 0, p <= n, p < n + 1 + m, p == n + 1 + m],
                    [-1, p, src(q) + 1 - step, src(q - 1) + 1], -1)
  offset = jnp.broadcast_to(jnp.asarray(offset, jnp.int32), (b,))
  return jnp.where(slot >= 0, offset[:, None] + slot, 0).astype(jnp.int32)
