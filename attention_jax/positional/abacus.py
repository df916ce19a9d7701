"""Abacus embeddings (McLeish et al. 2024, "Transformers Can Do Arithmetic
with the Right Embeddings"): one learned row per digit's index in its number.

A run of consecutive digit tokens is a number; its digits are numbered 1, 2,
3, … from the run's first token (numbers written least significant digit
first, so index i is significance i for every operand and the sum alike),
every other token 0. The embedding adds `table[id]` to the token embeddings,
row 0 included (the official `nn.Embedding` looks up every token). In
training a random offset k in [0, max_k] is added to every nonzero id, one k
per batch (`random.randint(0, max_k)` per forward), so the rows past the
training lengths are trained too; evaluation uses k = 0.

Official code: mcleish7/arithmetic `abacus.py` (`Abacus.helper` computes the
ids; our `abacus_ids` equals it, tests/positional/test_abacus.py).

An id past the table (a number longer than `rows - 1 - max_k` digits at
evaluation) is an error, at trace time for static tokens and at run time (a
host callback) for traced ones, unless the caller has checked the lengths
(`check_ids=False`: the lab sizes the table to its longest evaluation).
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import check_dtypes
from attention_jax.positional.parameters import param


def abacus_ids(tokens: jax.Array, digit_tokens: Sequence[int],
               previous_run: Optional[jax.Array] = None) -> jax.Array:
  """int32 `[B, T]`: 1-based index of each digit token in its run of
  consecutive digit tokens, 0 for any other token.

  tokens int `[B, T]`; digit_tokens the ids of '0' … '9'; previous_run int
  `[B]`: the id of the token just before `tokens[:, 0]` (0 if it was no
  digit), for decoding a chunk after a cache; default 0 (a fresh sequence).
  """
  tokens = jnp.asarray(tokens)
  is_digit = jnp.isin(tokens, jnp.asarray(np.asarray(digit_tokens), tokens.dtype))
  index = jnp.arange(tokens.shape[1], dtype=jnp.int32)
  before = -1 if previous_run is None else -1 - jnp.asarray(previous_run, jnp.int32)[:, None]
  # The last non-digit at or before each token; the run continues from `before`.
  last_break = jax.lax.cummax(jnp.where(is_digit, jnp.broadcast_to(before, tokens.shape),
                                        index), axis=1)
  return jnp.where(is_digit, index - last_break, 0).astype(jnp.int32)


def offset_ids(ids: jax.Array, offset) -> jax.Array:
  """ids `[B, T]` with `offset` (int or `[B]`) added to the nonzero ones."""
  offset = jnp.asarray(offset, jnp.int32)
  offset = offset[:, None] if offset.ndim == 1 else offset
  return jnp.where(ids > 0, ids + offset, ids)


def sample_offset(key: jax.Array, max_k: int, batch_size: int) -> jax.Array:
  """int32 `[B]`: one k in [0, max_k] for the whole batch, as the official
  code draws one per forward pass."""
  k = jax.random.randint(key, (), 0, max_k + 1, jnp.int32)
  return jnp.full((batch_size,), k, jnp.int32)


def _past_table_message(hi: int, rows: int) -> str:
  return (f'Abacus ids reach {hi} (a number of {hi} digits, offset included) but the table '
          f'has {rows} rows (ids 0 … {rows - 1}); size it (abacus_embeddings) to the '
          'longest number plus max_k, plus 1.')


def _raise_if_past_table(hi, rows: int) -> None:
  if int(hi) >= rows:
    raise ValueError(_past_table_message(int(hi), rows))


class Abacus(nnx.Module):
  """Adds `table[abacus_ids(tokens) + k]` to token embeddings `[B, T, D]`.

  Args:
    digit_tokens: the token ids of the ten digits.
    rows: rows of the table (ids 0 … rows-1), the official `max_seq_length`.
    d_model: embedding width.
    max_k: the largest training offset (`sample_offset`); 0 = none.
    check_ids: the run-time range check of traced ids (module docstring).
    dtype: the dtype of the sum (None: the embeddings' own).
    param_dtype: the table's dtype; default float32.
    rngs: `nnx.Rngs`; the table is N(0, 1), as `torch.nn.Embedding`'s.
  """

  def __init__(self, digit_tokens: Sequence[int], rows: int, d_model: int, *,
               max_k: int = 0, check_ids: bool = True, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    digits = tuple(int(t) for t in digit_tokens)
    if len(digits) != 10 or len(set(digits)) != 10:
      raise ValueError(f'abacus_digits must be the 10 distinct token ids of the digits 0 … 9, '
                       f'got {tuple(digit_tokens)!r}.')
    if not isinstance(rows, (int, np.integer)) or rows < 2:
      raise ValueError(f'abacus_embeddings={rows!r} must be an integer >= 2 (row 0 for '
                       'non-digits, then one per digit index).')
    if not isinstance(max_k, (int, np.integer)) or max_k < 0 or max_k > rows - 2:
      raise ValueError(f'abacus_max_k={max_k!r} must be an integer in 0 … {rows - 2} '
                       f'(abacus_embeddings={rows} rows).')
    self.digit_tokens, self.rows, self.max_k = digits, int(rows), int(max_k)
    self.check_ids = bool(check_ids)
    self.dtype, param_dtype = check_dtypes('Abacus', dtype, param_dtype)
    self.table = param(nnx.initializers.normal(1.0)(rngs.params(), (rows, d_model)),
                       (None, EMBED), param_dtype)

  def ids(self, tokens, offset=None, previous_run=None, *, check: bool = True) -> jax.Array:
    """The table rows `[B, T]` the tokens look up, checked against the table
    (`check=False`: the caller has proven the range, e.g. ids bounded by a
    cache shorter than the table)."""
    ids = abacus_ids(tokens, self.digit_tokens, previous_run)
    if offset is not None:
      ids = offset_ids(ids, offset)
    try:
      concrete = np.asarray(ids)
    except jax.errors.TracerArrayConversionError:
      concrete = None
    if concrete is not None:
      if concrete.size:
        _raise_if_past_table(concrete.max(), self.rows)
    elif self.check_ids and check:
      jax.debug.callback(_raise_if_past_table, ids.max(), self.rows)
    return ids

  def __call__(self, x, ids):
    """x `[B, T, D]` + table rows at ids `[B, T]` (from `ids`)."""
    rows = jnp.take(self.table[...], ids, axis=0)
    dtype = self.dtype or x.dtype  # None: the activations' own (positional.base)
    return x.astype(dtype) + rows.astype(dtype)
