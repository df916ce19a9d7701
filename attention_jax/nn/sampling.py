"""Sampling a token from logits: temperature, then top-k, then top-p (nucleus).

The order and the meaning of each step are Hugging Face's logits warpers
(`TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`, applied in
that order by `generate`) and Flax's Gemma sampler (softmax of logits / T,
then the nucleus):

- temperature T: the logits are divided by T; T = 0 is greedy (the argmax of
  the raw logits), the limit of T -> 0.
- top_k = k: the k largest scaled logits stay, exactly k: ties at the k-th
  go to the lower token id, as in `jax.lax.top_k` and `jnp.argmax`, so
  `top_k=1` is greedy. Hugging Face keeps every token tied with the k-th.
- top_p = p: of what top-k left, the smallest set of the most probable tokens
  whose probability reaches p (token i stays when the tokens before it hold
  less than p), always at least the most probable one; p = 1 keeps all.
  Hugging Face and MaxText draw the same line; Flax's Gemma sampler also
  keeps a token whose predecessors hold exactly p. MaxText's composite
  sampler applies top-k and top-p before the temperature, so its nucleus is
  that of T = 1; here, as in Hugging Face and Flax, it is that of the
  distribution actually sampled.

Logits are processed in float32 whatever their dtype; removed tokens get the
finite `MASK_VALUE`, never -inf, so no legal input gives NaN. Under `jit` a
traced temperature or top_p cannot be checked: an invalid one makes
`process_logits` return NaN and `sample_tokens` return -1 (no token id), so
no result of it can pass for a sample.
"""

import math
import operator
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention import MASK_VALUE
from attention_jax.nn.cache import is_static


def check_sampling_options(temperature=None, top_k=None, top_p=None,
                           vocab_size: Optional[int] = None) -> Optional[int]:
  """top_k as an int (or None); a ValueError/TypeError naming a sampling
  option that is not allowed.

  temperature: a finite number >= 0 (float scalar; checked when known, not
  when traced). top_k: a Python int in 1 … vocab_size (static: it sizes
  `jax.lax.top_k`). top_p: a number in (0, 1] (checked when known).
  """
  if temperature is not None:
    _check_scalar('temperature', temperature)
    if is_static(temperature):
      value = float(temperature)
      if not (math.isfinite(value) and value >= 0):
        raise ValueError(f'temperature={value} is not allowed: it must be a finite number '
                         '>= 0 (0 is greedy).')
  if top_k is not None:
    top_k = static_int('top_k', top_k, 'a Python int (static: it sizes `jax.lax.top_k`), '
                       '1 … the vocabulary size, or None for all')
    if top_k < 1 or (vocab_size is not None and top_k > vocab_size):
      upper = 'the vocabulary size' if vocab_size is None else f'{vocab_size} (vocab_size)'
      raise ValueError(f'top_k={top_k} is not allowed: it must be in 1 … {upper}, or None '
                       'for all.')
  if top_p is not None:
    _check_scalar('top_p', top_p)
    if is_static(top_p):
      value = float(top_p)
      if not 0 < value <= 1:
        raise ValueError(f'top_p={value} is not allowed: it must be in (0, 1] (1 keeps '
                         'every token), or None.')
  return top_k


def static_int(name: str, value, allowed: str) -> int:
  """`value` as an int if it is one known now (a Python, NumPy or concrete
  JAX integer); else a TypeError naming it and what is `allowed`."""
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f'{name}={value!r} must be {allowed}.')
  try:
    return operator.index(value)
  except TypeError:  # a float, or a traced value (ConcretizationTypeError)
    raise TypeError(f'{name}={value!r} must be {allowed}.') from None


def _check_scalar(name, value) -> None:
  dtype = jnp.result_type(value)
  if isinstance(value, (bool, np.bool_)) or not (jnp.issubdtype(dtype, jnp.floating)
                                                or jnp.issubdtype(dtype, jnp.integer)):
    raise TypeError(f'{name}={value!r} must be a real number, got {dtype}.')
  if np.shape(value):
    raise ValueError(f'{name} must be a scalar, got shape {np.shape(value)}.')


def options_valid(temperature=None, top_p=None) -> jax.Array:
  """bool scalar: whether the (possibly traced) temperature and top_p are
  allowed; what `check_sampling_options` cannot check under `jit`."""
  valid = jnp.bool_(True)
  if temperature is not None:
    t = jnp.asarray(temperature, jnp.float32)
    valid &= jnp.isfinite(t) & (t >= 0)
  if top_p is not None:
    p = jnp.asarray(top_p, jnp.float32)
    valid &= (p > 0) & (p <= 1)
  return valid


def process_logits(logits: jax.Array, *, temperature=1.0, top_k: Optional[int] = None,
                   top_p=None) -> jax.Array:
  """The logits a sample is drawn from: float32 `[..., V]` from `[..., V]`.

  Kept tokens hold (logits - max) / temperature (the shift changes no
  probability and keeps the quotient finite for a tiny temperature),
  removed ones `MASK_VALUE`: `jax.nn.softmax` of the result is the sampling
  distribution. Temperature 0 keeps only the argmax (ties: the lower id).
  Module docstring for top_k and top_p; NaN for an invalid traced
  temperature or top_p.
  """
  top_k = check_sampling_options(temperature, top_k, top_p, logits.shape[-1])
  return jnp.where(options_valid(temperature, top_p),
                   _processed(logits, temperature, top_k, top_p), jnp.nan)


def _processed(logits, temperature, top_k, top_p):
  logits = jnp.asarray(logits, jnp.float32)
  t = jnp.asarray(temperature, jnp.float32)
  # Temperature 0 must not divide by 0: its distribution is the argmax alone.
  safe_t = jnp.where(t > 0, t, 1.0)
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  scaled = jnp.maximum(shifted / safe_t, MASK_VALUE)
  if top_k is not None or top_p is not None:
    scaled = jnp.where(_kept(scaled, top_k, top_p), scaled, MASK_VALUE)
  argmax = jnp.arange(logits.shape[-1]) == jnp.argmax(logits, axis=-1, keepdims=True)
  return jnp.where((t > 0) | argmax, scaled, MASK_VALUE)


def _kept(scaled, top_k, top_p):
  """bool `[..., V]`: the tokens top-k and then top-p keep."""
  k = scaled.shape[-1] if top_k is None else top_k
  values, ids = jax.lax.top_k(scaled, k)  # descending; ties: lower id first
  keep = jnp.ones(values.shape, bool)
  if top_p is not None:
    p = jnp.asarray(top_p, jnp.float32)
    probs = jax.nn.softmax(values, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more probable tokens
    # The first always stays; p = 1 keeps all (a rounded sum can reach 1
    # before the last tokens).
    keep = (before < p) | (p >= 1) | (jnp.arange(k) == 0)
  return jnp.put_along_axis(jnp.zeros(scaled.shape, bool), ids, keep, axis=-1,
                            inplace=False)


def sample_tokens(key: jax.Array, logits: jax.Array, *, temperature=1.0,
                  top_k: Optional[int] = None, top_p=None) -> jax.Array:
  """One token per row of logits `[..., V]` -> int32 `[...]`.

  Draws from `softmax(process_logits(logits, ...))` with `key` (one
  `jax.random.key` for the whole array); temperature 0 (may be traced) is
  the argmax of the logits (ties: the lower id), `key` then unused. -1 for
  an invalid traced temperature or top_p (module docstring).
  """
  top_k = check_sampling_options(temperature, top_k, top_p, logits.shape[-1])
  processed = _processed(logits, temperature, top_k, top_p)
  sampled = jax.random.categorical(key, processed, axis=-1)
  greedy = jnp.argmax(jnp.asarray(logits, jnp.float32), axis=-1)
  token = jnp.where(jnp.asarray(temperature) > 0, sampled, greedy).astype(jnp.int32)
  return jnp.where(options_valid(temperature, top_p), token, -1)
