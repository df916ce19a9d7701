"""Learned absolute positions (BERT, GPT; lesson 7.4): a trained table.

The table has `max_positions` rows and nothing beyond: a position past it is an
error, raised at trace time when the positions are static (the default
`arange`) and at run time when they are traced — never the NaN that
`jnp.take` returns nor the silent clip that indexing does.

The run-time check is a host callback (`jax.debug.callback`): a trip to the
host at every call on an accelerator, and a program `jax.export` refuses.
A caller that has proven the range before tracing (the lab validates every
length against the table) turns it off with `check_positions=False`; one
that proves it for a single call, statically (`check_position_range` on
bounds known at trace time), traces that call inside `positions_proven()`.
`TransformerLM.extend` does so with its default positions, the cache slots:
they cannot pass the cache's last slot, and a cache longer than the table
is refused at trace time, so the cached step needs no callback and exports.
"""

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import flag_option
from attention_jax.positional.base import real_option
from attention_jax.positional.parameters import EMBED
from attention_jax.positional.parameters import param
from attention_jax.positional.parameters import scope_dtype


def _out_of_range_message(lo: int, hi: int, max_positions: int) -> str:
  return (f'positions range over [{lo}, {hi}] but the learned table has '
          f'max_positions={max_positions} rows (valid positions 0 … {max_positions - 1}); '
          'size the table to the longest length you will evaluate.')


def _raise_if_out_of_range(lo, hi, max_positions: int) -> None:
  lo, hi = int(lo), int(hi)
  if lo < 0 or hi >= max_positions:
    raise ValueError(_out_of_range_message(lo, hi, max_positions))


# Trace-time state (read while tracing, never inside the program): whether
# the positions of the calls traced now were proven in range by the caller.
_PROVEN = threading.local()


@contextlib.contextmanager
def positions_proven():
  """Within it, traced positions skip the table's run-time range check (the
  host callback). Only for a caller that has checked, statically, every
  position the calls traced inside can take (`Learned.check_position_range`);
  static positions are still checked."""
  before = getattr(_PROVEN, 'value', False)
  _PROVEN.value = True
  try:
    yield
  finally:
    _PROVEN.value = before


def learned_lookup(table: jnp.ndarray, positions: jnp.ndarray,
                   check: bool = True) -> jnp.ndarray:
  """Rows of `table` `[max_positions, D]` at integer `positions` `[...]` -> `[..., D]`.
  `check=False` (or tracing inside `positions_proven()`) skips the run-time
  range check of traced positions; static ones are always checked."""
  max_positions = table.shape[0]
  try:
    concrete = np.asarray(positions)  # static positions: check at trace time
  except jax.errors.TracerArrayConversionError:
    concrete = None
  if concrete is None and check and not getattr(_PROVEN, 'value', False):
    jax.debug.callback(
        _raise_if_out_of_range, positions.min(), positions.max(), max_positions)
  elif concrete is not None and concrete.size:
    _raise_if_out_of_range(concrete.min(), concrete.max(), max_positions)
  return jnp.take(table, positions, axis=0)


class Learned(PositionalEncoding):
  """'learned': adds `table[positions]`; the table is an `nnx.Param`."""

  def __init__(self, max_positions: int, d_model: int, *, rngs: nnx.Rngs,
               stddev: float = 0.02, check_positions: bool = True):
    if max_positions is None or max_positions < 1:
      raise ValueError(
          f"the 'learned' encoding needs max_positions >= 1 (the rows of its table, "
          f'e.g. TransformerLM(max_positions=...)), got {max_positions}.')
    self.max_positions = max_positions
    self.check_positions = bool(check_positions)  # static: see the module docstring
    self.dtype = scope_dtype()  # make_encoding's; None: the activations' own
    self.table = param(nnx.initializers.normal(stddev)(rngs.params(), (max_positions, d_model)),
                       (None, EMBED))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs, stddev=0.02,
            check_positions=True):
    """Options: `stddev` of the table's initialisation, `check_positions`
    (the run-time range check of traced positions; see the module docstring)."""
    del num_heads, causal
    stddev = real_option('learned', 'stddev', stddev, at_least=0)
    check_positions = flag_option('learned', 'check_positions', check_positions)
    return cls(max_positions, d_model, rngs=rngs, stddev=stddev,
               check_positions=check_positions)

  def check_position_range(self, lo: int, hi: int, dtype=jnp.float32) -> None:
    del dtype  # rows of any dtype
    _raise_if_out_of_range(lo, hi, self.max_positions)

  def add_to_embeddings(self, x, positions):
    rows = learned_lookup(self.table[...], positions, self.check_positions)
    dtype = self.dtype or x.dtype
    return x.astype(dtype) + rows.astype(dtype)
