"""Position coupling (Cho et al. 2024, arXiv 2405.20671): each output token
gets the position id of the input token it is computed from.

For `BOS x_1 … x_n SEP y_1 … y_m EOS`, with x_i (1-based) in slot i and an
offset s:

    x_i            -> s + i
    y_k = x_src(k) -> s + src(k)        copy: k; reverse: n − k + 1;
                                         duplicate: (k − 1) mod n + 1,
                                         except y_n (below)
    SEP            -> s + 0 when the rule reads x forwards (src(1) = 1),
                      s + n + 1 when it reads backwards (reverse)
    BOS, EOS, PAD  -> 0

`src` is derived from the task's own rule (`copy.py`) (applied to the index array
0 … N−1 instead of symbols), so the ids always agree with the rule. What the
ids are for is the *query*: the token that predicts y_{k+1} (SEP for y_1,
y_k after it) sits one step before x_src(k+1) in reading order (−1 forwards,
+1 backwards), so one fixed id offset finds the input to copy at every
length. We write the rule that way: every output but the last takes the slot
one step before its successor's source, SEP included. For copy and reverse
that is exactly "y_k gets x_src(k)'s id". For duplicate it differs at one
token: y_n, whose successor y_{n+1} reads x_1 again, takes SEP's slot s + 0,
so the second copy starts as the first did; with y_n at s + n instead, the
lookup for y_{n+1} would have to jump n − 1 ids back, a distance that grows
with n and that no window trained on short inputs covers.

This follows the official code (HanseulJo/position-coupling,
src/data/copy.py, `CopyDatasetWithCoupledPositions`, with
src/tokenization/tokenization.py putting BOS at id 0): copy gives x ids
start+1 … start+n, '=' (our SEP) start and y the ids of the x they copy;
reverse gives x start … start+n−1, '=' start+n, y reversed. Ours is the same
up to a shift of the reverse ids by one (ours start at s+1 for every task).
Their EOS gets id 0 (the padding id, as the position list is one short of
the tokens): so does ours. Duplicate is not in their code; ours is the query
rule above.

Training draws the offset s uniformly per example from [1, max_position − n − 2]
(theirs: start from [1, max_position − n]), so every id below `max_position`
is trained; evaluation uses s = 1 (their non-randomized start).
"""

import jax
import jax.numpy as jnp

from attention_jax.positional.coupling import coupled_position_ids


def coupled_positions(spec, lengths: jax.Array, total: int, offset: jax.Array) -> jax.Array:
  """int32 `[B, total]` coupled position ids for examples of input lengths
  `lengths` `[B]` of a copying task (`copy.CopyingTask`) laid out as
  `tasks.make_batch` lays them out (the full token sequence, before the
  input/target shift), with per-example `offset` `[B]`: the library's
  `positional.coupled_position_ids` on the task's rule."""
  return coupled_position_ids(spec.rule, lengths, total, offset,
                              output_factor=spec.output_factor)


def random_offsets(key: jax.Array, lengths: jax.Array, max_position: int) -> jax.Array:
  """Offsets s `[B]`, uniform in [1, max_position − n − 2] per example, so the
  largest id (s + n + 1) stays below `max_position`."""
  high = max_position - lengths.astype(jnp.int32) - 1  # exclusive
  return jax.random.randint(key, lengths.shape, 1, jnp.maximum(high, 2), jnp.int32)


def check_max_position(max_position: int, max_input_length: int) -> None:
  """Ids of inputs up to `max_input_length` must fit below `max_position`."""
  if max_position < max_input_length + 3:
    raise ValueError(
        f'coupled positions: max_position={max_position} is below '
        f'max_input_length + 3 = {max_input_length + 3} (ids 0 … n + 2 at offset 1); '
        'raise positions.max_position or set it to 0 (auto).')
