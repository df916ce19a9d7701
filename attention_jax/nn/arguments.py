"""How `MultiHeadAttention` reads its arguments, written our way or Flax's:
the constructor's (`checked_arguments`: the width, `d_model` or
`in_features`, and every other value checked before a parameter is made),
the call's inputs (`x`/`context` or `inputs_q`/`inputs_k`/`inputs_v`,
`is_causal`) and dropout's `deterministic` flags (Flax's precedence)."""

import math
import numbers
import types

import numpy as np
from flax import nnx

from attention_jax.attention.checks import as_bool_mask
from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_count
from attention_jax.attention.checks import check_flag
from attention_jax.attention.checks import check_rate
from attention_jax.attention.dispatch import check_options
from attention_jax.attention.heads import as_rank4
from attention_jax.attention.heads import check_broadcast
from attention_jax.attention.normalization import as_normalization
from attention_jax.attention.segments import check_segment_ids
from attention_jax.attention.soft_cap import check_soft_cap
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.parameters import check_dtypes
from attention_jax.positional.registry import check_encoding_name

OWNER = 'MultiHeadAttention'

CAUSAL = ('MultiHeadAttention needs causal=: pass causal=True (decoder: query i sees keys '
          'j <= i) or causal=False (encoder / cross-attention, as flax.nnx.MultiHeadAttention '
          'computes without a mask).')
ORDER = ('the positional order is the lesson\'s, MultiHeadAttention(d_model, num_heads); '
         'flax.nnx.MultiHeadAttention\'s is (num_heads, in_features): write that one with '
         'keywords, MultiHeadAttention(num_heads=..., in_features=...)')


def model_width(d_model, in_features):
  """The module's width from `d_model` (ours) or `in_features` (Flax's)."""
  if d_model is not None and in_features is not None:
    raise ValueError(f'd_model={d_model} and in_features={in_features} name the same width: '
                     'give one (d_model positionally, or in_features= as in Flax).')
  width = in_features if d_model is None else d_model
  if width is None:
    raise ValueError('MultiHeadAttention needs its width: d_model (positional) or '
                     f'in_features=; {ORDER}.')
  return width


def call_inputs(x, context, inputs_q, inputs_k, inputs_v, is_causal, causal: bool):
  """(x, context) of a call written our way or Flax's: `inputs_q` is `x`,
  `inputs_k` is `context`, `inputs_v` may only be the keys' input itself;
  keys' input that is `x` itself (the same array) is self-attention, context
  None. `is_causal` must agree with the module's `causal`."""
  for ours, flax_name, a, b in (('x', 'inputs_q', x, inputs_q),
                                ('context', 'inputs_k', context, inputs_k)):
    if a is not None and b is not None:
      raise ValueError(f'{ours} and {flax_name}= name the same input (ours and Flax\'s name): '
                       'give one of them.')
  x = inputs_q if x is None else x
  context = inputs_k if context is None else context
  if x is None:
    raise ValueError('MultiHeadAttention needs the queries\' input: x (positional) or '
                     'inputs_q= (Flax\'s name).')
  keys_input = x if context is None else context
  if inputs_v is not None and inputs_v is not keys_input:
    raise ValueError('inputs_v must be the keys\' input itself (context, Flax\'s inputs_k; '
                     'default x): the values come from it, there is no separate value input.')
  if is_causal is not None and bool(is_causal) != causal:
    raise ValueError(f'is_causal={is_causal} but this module has causal={causal}: causality is '
                     'set at construction (it also picks the encoding\'s bias); build it with '
                     f'causal={bool(is_causal)}.')
  return x, None if context is x else context


def check_call(module, decoding: bool, mask, distances, segment_ids, context_segment_ids):
  """What a call of `module` (a `MultiHeadAttention`) may combine, full pass or
  decoding -> its mask as booleans (Flax's float 0/1 masks converted,
  `checks.as_bool_mask`)."""
  if distances is not None and (decoding or not module.positional.reads_distances):
    raise ValueError(f'distances= is read in a full pass by encodings with reads_distances '
                     f'(alibi, relative), not {type(module.positional).__name__} (decode='
                     f'{decoding}).')
  if decoding and (segment_ids is not None or context_segment_ids is not None):
    raise ValueError('segment_ids= with decode=True: the module\'s own (Flax) cache keeps '
                     'one document per row; decode packed rows with extend(x, cache, start, '
                     'segment_ids=...) and a cache from init_cache(batch, cache_size), which '
                     'keeps each slot\'s document.')
  return as_bool_mask('mask', None if mask is None else check_array('mask', mask))


def check_full_pass(module, x, context, mask, kv_lengths, segment_ids, context_segment_ids,
                    deterministic):
  """A full pass of `module` (a `MultiHeadAttention`) over x `[B, T_q, d_model]`
  and context `[B, T_k, in_kv_features]` (x itself for self-attention):
  shapes, mask `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`, segment ids and
  dropout checked before any projection -> (q ids, kv ids, dropping)."""
  for name, a, width in (('x', x, module.d_model), ('context', context,
                                                    module.in_kv_features)):
    if a.ndim != 3 or a.shape[-1] != width:
      raise ValueError(f'{name} must be [batch, length, {width}], got {a.shape}.')
  if module.causal and x.shape[1] != context.shape[1]:
    raise ValueError(f'this MultiHeadAttention is causal (causal=True), which needs as '
                     f'many queries as keys, got {x.shape[1]} and {context.shape[1]}; '
                     'build cross-attention with causal=False.')
  if mask is not None:
    check_broadcast('mask', as_rank4('mask', mask),
                    (x.shape[0], module.num_heads, x.shape[1], context.shape[1]))
  segments = check_segment_ids(segment_ids, context_segment_ids, x.shape[0], x.shape[1],
                               context.shape[1], names=('segment_ids', 'context_segment_ids'))
  if segments is not None and module.ssmax_scale is not None:
    raise ValueError('segment_ids= with scalable_softmax: its log n counts the keys a '
                     'query sees by index, across documents; packed rows are not '
                     'served with it.')
  dropping = not resolve_deterministic(module.dropout_rate, deterministic,
                                       module.deterministic)
  if dropping and module.implementation not in ('auto', 'dense'):
    raise ValueError(
        f'dropout_rate={module.dropout_rate} drops attention weights, which only the dense '
        f'kernel forms, but implementation={module.implementation!r}: use \'auto\' or '
        '\'dense\', or call with deterministic=True.')
  q_ids, kv_ids = (None, None) if segments is None else segments
  return q_ids, kv_ids, dropping


def default_positions(x, context, positions, context_positions):
  """The call's defaults: queries at 0 … T_q-1; keys at the queries'
  positions for self-attention (`context` is `x`), else 0 … T_k-1."""
  if positions is None:
    positions = np.arange(x.shape[1], dtype=np.int32)
  if context_positions is None:
    context_positions = (positions if context is x
                         else np.arange(context.shape[1], dtype=np.int32))
  return positions, context_positions


def resolve_deterministic(rate: float, *flags) -> bool:
  """The first of `flags` that is not None (call, then module), Flax's rule;
  with rate 0 dropout is off whatever they say."""
  if rate == 0.0:
    return True
  for flag in flags:
    if flag is not None:
      return bool(flag)
  raise ValueError(f'dropout_rate={rate} needs to know whether to drop: pass '
                   'deterministic=True/False to the constructor or the call, or set it '
                   'on the whole model with model.train() / model.eval().')


def check_encoding_argument(owner: str, encoding) -> None:
  """An encoding is a registry name (checked, with a suggestion), a
  `PositionalEncoding` or None; refused before any parameter is made."""
  if isinstance(encoding, str):
    check_encoding_name(encoding)
  elif encoding is not None and not isinstance(encoding, PositionalEncoding):
    raise TypeError(f'{owner}: encoding must be a registry name, a PositionalEncoding or '
                    f'None, got {type(encoding).__name__}.')


def check_rngs(owner: str, rngs) -> None:
  """Parameters are drawn from an `nnx.Rngs`; anything else (a seed, a key)
  is refused before any is made."""
  if not isinstance(rngs, nnx.Rngs):
    raise TypeError(f'{owner}: rngs must be an nnx.Rngs (e.g. nnx.Rngs(0)), got '
                    f'{type(rngs).__name__}.')


def checked_arguments(*, d_model, num_heads, in_features, qkv_features, out_features,
                      in_kv_features, encoding, causal, num_kv_heads, sliding_window,
                      max_positions, use_bias, dtype, param_dtype, dropout_rate, deterministic,
                      broadcast_dropout, decode, implementation, chunk_size,
                      chunked_strategy, scalable_softmax, normalization, logit_soft_cap,
                      sinks, rngs) -> types.SimpleNamespace:
  """`MultiHeadAttention`'s constructor arguments checked, before any
  parameter is made -> the values it reads (`d_model`, `num_heads`,
  `num_kv_heads`, `dtype`, `param_dtype`, `causal`, `normalization`)."""
  if causal is None:
    raise ValueError(CAUSAL)
  causal = check_flag(OWNER, 'causal', causal)
  dtype, param_dtype = check_dtypes(OWNER, dtype, param_dtype)
  d_model = model_width(d_model, in_features)
  d_model = check_count(OWNER, 'd_model' if in_features is None else 'in_features', d_model)
  if num_heads is None:
    raise ValueError(f'MultiHeadAttention needs num_heads; {ORDER}.')
  num_heads = check_count(OWNER, 'num_heads', num_heads)
  if d_model % num_heads:
    raise ValueError(
        f'num_heads={num_heads} must be >= 1 and divide d_model={d_model}; {ORDER}.')
  if qkv_features is not None and qkv_features != d_model:
    raise ValueError(f'qkv_features={qkv_features}: this module keeps queries, keys and '
                     f'values at the width d_model={d_model} (head_dim = d_model // '
                     'num_heads, which the encodings read); leave qkv_features unset.')
  for name, value in (('out_features', out_features), ('in_kv_features', in_kv_features),
                      ('max_positions', max_positions)):
    if value is not None:
      check_count(OWNER, name, value)
  check_rate(OWNER, 'dropout_rate', dropout_rate)
  num_kv_heads = check_count(OWNER, 'num_kv_heads',
                             num_heads if num_kv_heads is None else num_kv_heads)
  if num_heads % num_kv_heads:
    raise ValueError(f'num_kv_heads={num_kv_heads} must be >= 1 and divide '
                     f'num_heads={num_heads}.')
  if sliding_window is not None and (not isinstance(sliding_window, int)
                                     or isinstance(sliding_window, bool)
                                     or sliding_window < 1):
    raise ValueError(f'sliding_window={sliding_window!r}: use an integer >= 1 or None.')
  check_options(implementation, chunked_strategy, chunk_size)
  if not isinstance(sinks, bool):
    raise TypeError(f'sinks={sinks!r}: use True (one learned sink logit per head) or '
                    'False.')
  for name, value in (('use_bias', use_bias), ('broadcast_dropout', broadcast_dropout),
                      ('decode', decode)):
    check_flag(OWNER, name, value)
  if deterministic is not None:
    check_flag(OWNER, 'deterministic', deterministic)
  if scalable_softmax is not None and (
      isinstance(scalable_softmax, bool) or not isinstance(scalable_softmax, numbers.Real)
      or not math.isfinite(scalable_softmax) or not scalable_softmax > 0):
    raise ValueError(f'scalable_softmax={scalable_softmax!r}: the initial s must be > 0 '
                     '(or None for plain softmax).')
  norm = as_normalization(normalization)
  if norm is not None and not causal:
    raise ValueError(f'normalization={normalization!r} (stick-breaking) reads the keys '
                     'before each query: it needs causal=True.')
  check_soft_cap(logit_soft_cap)
  if norm is not None and (logit_soft_cap is not None or sinks):
    raise ValueError(f'logit_soft_cap={logit_soft_cap!r}, sinks={sinks!r}: both act on a '
                     f'softmax, not on normalization={normalization!r} (stick-breaking).')
  check_rngs(OWNER, rngs)
  check_encoding_argument(OWNER, encoding)
  return types.SimpleNamespace(d_model=d_model, num_heads=num_heads,
                               num_kv_heads=num_kv_heads, dtype=dtype,
                               param_dtype=param_dtype, causal=causal, normalization=norm)


def check_constructor(owner: str, *, rngs, counts=(), optional_counts=(), flags=(),
                      optional_flags=(), rate=None, encoding=None,
                      encoding_options=None) -> None:
  """A model constructor's arguments checked before any parameter is made:
  `counts` (name, value) pairs must be integers >= 1 (`optional_counts`:
  or None), `flags` bools (`optional_flags`: or None), `rate` a (name,
  value) dropout rate in [0, 1), `encoding` a registry name if a string,
  `encoding_options` None or a dict, `rngs` an `nnx.Rngs`."""
  check_encoding_argument(owner, encoding)
  for name, value in counts:
    check_count(owner, name, value)
  for name, value in optional_counts:
    if value is not None:
      check_count(owner, name, value)
  for name, value in flags:
    check_flag(owner, name, value)
  for name, value in optional_flags:
    if value is not None:
      check_flag(owner, name, value)
  if rate is not None:
    check_rate(owner, *rate)
  if encoding_options is not None and not isinstance(encoding_options, dict):
    raise TypeError(f'{owner}: encoding_options={encoding_options!r} must be a dict of the '
                    'encoding\'s keyword options (e.g. {"base": 500.0}) or None.')
  check_rngs(owner, rngs)
