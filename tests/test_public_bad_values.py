"""Every public function and module constructor against a table of bad values.

The rule: for each callable in `attention_jax.__all__`, every argument of its
signature has a kind (`ARGUMENT_KINDS`, by name, or its recipe's `kinds`), and
every bad value of that kind (`BAD_VALUES`: zero, negative, too large,
non-integer, wrong dtype, wrong rank or shape, NaN, empty batch, a string
where a bool goes, ...) is either served as the table says (`Serve`) or
refused early with a ValueError/TypeError whose message names the argument:
never another exception from deep inside JAX or Python, never a silent
result. A public name without a recipe (or an exemption saying why), or an
argument without a kind, fails `test_every_public_name_has_a_recipe`.

Shapes are tiny (B=2, T=4, H=2, D=4): the refusals do no JAX work at all.
"""

import dataclasses
import inspect
import math
from typing import Any, Callable, Optional

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import attention_jax as aj

B, T, H, D = 2, 4, 2, 4


def _array(*shape, dtype=np.float32, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape).astype(dtype))


def _ids(*shape):
  return jnp.zeros(shape, jnp.int32)


@dataclasses.dataclass(frozen=True)
class Serve:
  """A bad-looking value that must be served: `check(result, clean)` holds,
  `clean` being the result of the recipe's valid call; with `or_refuse`, a
  refusal naming the argument is right too."""
  check: Callable[[Any, Any], bool]
  says: str
  or_refuse: bool = False


REFUSE = None


@dataclasses.dataclass(frozen=True)
class Bad:
  label: str
  value: Any  # a constant, or a function of the argument's valid value
  expect: Optional[Serve] = REFUSE

  def make(self, valid):
    return self.value(valid) if callable(self.value) and not isinstance(self.value, type) \
        else self.value


def _leaves(result):
  if dataclasses.is_dataclass(result):  # a score spec holds what it was given
    result = [getattr(result, f.name) for f in dataclasses.fields(result)]
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(result)
          if hasattr(x, 'shape')]


HAS_NAN = Serve(lambda out, clean: any(np.isnan(x).any() for x in _leaves(out)
                                       if np.issubdtype(x.dtype, np.floating)),
                'NaN in, NaN out (not hidden)', or_refuse=True)
# Only the one array swept is empty, so a refusal of the mismatch is right too.
EMPTY_BATCH = Serve(lambda out, clean: all(x.shape[:1] == (0,) for x in _leaves(out)),
                    'an empty batch in, an empty batch out', or_refuse=True)
SAME = Serve(lambda out, clean: all(np.array_equal(a, b, equal_nan=True) for a, b in zip(
    _leaves(out), _leaves(clean))), 'the same result as the valid value')


def _float_mask(mask):
  return jnp.asarray(mask, jnp.float32)


def _wrong_shape(x):
  """One longer along the last two axes (a (T+1, T+1) mask for T)."""
  x = np.asarray(x)
  pad = [(0, 0)] * (x.ndim - 2) + [(0, 1), (0, 1)] if x.ndim >= 2 else [(0, 1)]
  return jnp.asarray(np.pad(x, pad))


NOT_A_FLAG = [Bad('string', 'yes'), Bad('number', 2), Bad('float', 0.5)]
COUNT = [Bad('zero', 0), Bad('negative', -1), Bad('non_integer', 4.0), Bad('string', '4'),
         Bad('bool', True)]
POSITIVE = [Bad('zero', 0.0), Bad('negative', -1.0), Bad('nan', math.nan),
            Bad('inf', math.inf), Bad('string', '1.0'), Bad('bool', True)]
FLOAT_ARRAY = [Bad('rank_down', lambda x: x[0]), Bad('int_dtype', lambda x: x.astype(jnp.int32)),
               Bad('string', 'q')]

BAD_VALUES = {
    'count': COUNT,
    'count_or_zero': [Bad('negative', -1), Bad('non_integer', 4.0), Bad('string', '4'),
                      Bad('bool', True)],
    'optional_count': COUNT,
    'flag': NOT_A_FLAG,
    'optional_flag': NOT_A_FLAG,
    'positive': POSITIVE,
    'rate': [Bad('negative', -0.1), Bad('one', 1.0), Bad('nan', math.nan),
             Bad('string', '0.1')],
    'choice': [Bad('unknown', 'nope'), Bad('wrong_type', 3)],
    'dtype': [Bad('not_a_dtype', 'floaty'), Bad('integer', jnp.int32), Bad('number', 3)],
    'rngs': [Bad('seed', 0), Bad('key', lambda _: jax.random.key(0))],
    # [B, T, H, D] queries, keys, values.
    'qkv': FLOAT_ARRAY + [Bad('nan', lambda x: jnp.full_like(x, jnp.nan), HAS_NAN),
                          Bad('empty_batch', lambda x: x[:0], EMPTY_BATCH)],
    # Any other float array (one head, a bias, per-token values).
    'float_array': FLOAT_ARRAY + [Bad('nan', lambda x: jnp.full_like(x, jnp.nan), HAS_NAN)],
    'mask': [Bad('wrong_shape', _wrong_shape), Bad('rank_down', lambda m: m[0]),
             Bad('int_dtype', lambda m: m.astype(jnp.int32)),
             Bad('float_not_0_1', lambda m: _float_mask(m) * 0.5),
             Bad('float_0_1', _float_mask, SAME), Bad('string', 'causal')],
    'bias': [Bad('wrong_shape', _wrong_shape), Bad('bool_dtype', lambda b: b > 0),
             Bad('nan', lambda b: jnp.full_like(b, jnp.nan), HAS_NAN), Bad('string', 'alibi')],
    # Integer [B] lengths of keys or prompts (the valid value's batch and range).
    'lengths': [Bad('negative', lambda x: x.at[0].set(-1)),
                Bad('too_large', lambda x: x.at[0].set(1000)),
                Bad('float', lambda x: x.astype(jnp.float32)),
                Bad('wrong_batch', lambda x: jnp.concatenate([x, x])),
                Bad('rank_up', lambda x: x[:, None])],
    # Integer ids or positions.
    'int_array': [Bad('float', lambda x: x.astype(jnp.float32)),
                  Bad('wrong_shape', lambda x: jnp.concatenate([x, x], axis=-1)),
                  Bad('string', 'ids')],
    # combine_masks broadcasts its masks together: a rank it can broadcast is no error.
    'masks': [Bad('wrong_shape', _wrong_shape), Bad('int_dtype', lambda m: m.astype(jnp.int32)),
              Bad('float_not_0_1', lambda m: _float_mask(m) * 0.5),
              Bad('float_0_1', _float_mask, SAME), Bad('string', 'causal')],
    # A spec's bias, checked against the call's shapes only when called.
    'dense_bias': [Bad('rank_down', lambda b: b[0]), Bad('bool_dtype', lambda b: b > 0),
                   Bad('nan', lambda b: jnp.full_like(b, jnp.nan), HAS_NAN),
                   Bad('string', 'alibi')],
    'slopes': [Bad('scalar', 0.5), Bad('strings', ('a', 'b')), Bad('nan', (math.nan, 0.5)),
               Bad('rank_up', ((0.5,), (0.25,))), Bad('string', 'alibi')],
    # Positions or ids on their own (any length): float, string, no length axis.
    'positions': [Bad('float', lambda x: x.astype(jnp.float32)), Bad('string', 'ids'),
                  Bad('scalar', 3)],
    # [B, T] ids given with others of the same batch.
    'ids': [Bad('float', lambda x: x.astype(jnp.float32)), Bad('string', 'ids'),
            Bad('rank_down', lambda x: x[0]),
            Bad('wrong_batch', lambda x: jnp.concatenate([x, x]))],
    'token_mask': [Bad('rank_down', lambda m: m[0]), Bad('rank_up', lambda m: m[None]),
                   Bad('int_dtype', lambda m: m.astype(jnp.int32)),
                   Bad('float_not_0_1', lambda m: _float_mask(m) * 0.5),
                   Bad('float_0_1', _float_mask, SAME), Bad('string', 'causal')],
    'scalar': [Bad('vector', lambda x: jnp.stack([x, x])), Bad('string', 'sink'),
               Bad('int_dtype', lambda x: x.astype(jnp.int32)),
               Bad('nan', lambda x: jnp.full_like(x, jnp.nan), HAS_NAN)],
    'lengths_alone': [Bad('negative', lambda x: x.at[0].set(-1)),
                      Bad('too_large', lambda x: x.at[0].set(1000)),
                      Bad('float', lambda x: x.astype(jnp.float32)),
                      Bad('rank_up', lambda x: x[:, None])],
    'tokens': [Bad('float', lambda x: x.astype(jnp.float32) + 0.5), Bad('string', 'hello'),
               Bad('rank_down', lambda x: x[0]), Bad('empty_length', lambda x: x[:, :0])],
    'encoding': [Bad('typo', 'ropee'), Bad('case', 'Rope'), Bad('modifier', 'rope:randomised'),
                 Bad('number', 3)],
    'options': [Bad('typo', {'bse': 500.0}), Bad('not_a_dict', 'base=500')],
    'name': [Bad('empty', ''), Bad('number', 3)],
}
# Arguments whose bad values are beyond a table: each says why.
UNSWEPT = {
    'origin': 'a label for error messages; any string or None',
    'masks': '*masks: swept through its `mask` kind in the recipe of combine_masks',
    'model': 'any object with the cache protocol; generate refuses others (its own test)',
    'key': 'a PRNG key; jax.random refuses others at the draw',
    'cls': 'a class; register_encoding refuses non-subclasses (its own test)',
    'options': '**options of make_encoding: swept as encoding options',
}

ARGUMENT_KINDS = {
    **dict.fromkeys(['length', 'q_len', 'k_len', 'max_length', 'window', 'd_model', 'd_k',
                     'num_heads', 'query_dim', 'key_dim', 'vocab_size', 'embed_dim',
                     'hidden_dim', 'output_size', 'num_layers', 'mlp_dim', 'num_tokens',
                     'in_features'], 'count'),
    **dict.fromkeys(['d_v', 'num_kv_heads', 'sliding_window', 'max_positions', 'chunk_size',
                     'q_chunk', 'k_chunk', 'heads_per_step', 'out_features',
                     'in_kv_features', 'qkv_features', 'top_k'], 'optional_count'),
    **dict.fromkeys(['causal', 'return_weights', 'attend_current', 'use_bias', 'decode',
                     'broadcast_dropout', 'sinks', 'bidirectional', 'attention', 'sink',
                     'overwrite'], 'flag'),
    **dict.fromkeys(['deterministic', 'encoding_per_layer'], 'optional_flag'),
    **dict.fromkeys(['logit_soft_cap', 'scalable_softmax', 'temperature'], 'positive'),
    'dropout_rate': 'rate',
    **dict.fromkeys(['implementation', 'chunked_strategy', 'strategy', 'normalization',
                     'remainder', 'score'], 'choice'),
    **dict.fromkeys(['dtype', 'param_dtype'], 'dtype'),
    'rngs': 'rngs',
    **dict.fromkeys(['mask', 'token_mask'], 'mask'),
    'bias': 'bias',
    **dict.fromkeys(['kv_lengths', 'prompt_lengths', 'lengths'], 'lengths'),
    **dict.fromkeys(['segment_ids', 'kv_segment_ids', 'q_ids', 'kv_ids', 'q_positions',
                     'k_positions', 'positions', 'q_slots', 'prompt'], 'int_array'),
    'encoding': 'encoding',
    'encoding_options': 'options',
    'spec': 'encoding',
}


@dataclasses.dataclass
class Recipe:
  """How to call one public name validly (`valid()` -> keyword arguments),
  the valid value of each optional argument the sweep fills in
  (`samples()`), and the kinds of arguments named differently here than in
  `ARGUMENT_KINDS`; `call(**kwargs)` calls it (default: by keyword)."""
  valid: Callable[[], dict]
  samples: Callable[[], dict] = dict
  kinds: dict = dataclasses.field(default_factory=dict)
  call: Optional[Callable] = None
  skip: dict = dataclasses.field(default_factory=dict)  # argument -> why not swept


def _qkv():
  return dict(q=_array(B, T, H, D, seed=0), k=_array(B, T, H, D, seed=1),
              v=_array(B, T, H, D, seed=2))


def _head():
  return dict(q=_array(T, D, seed=0), k=_array(T, D, seed=1), v=_array(T, D, seed=2))


def _rngs():
  return nnx.Rngs(0)


def _mha_valid():
  return dict(d_model=8, num_heads=2, causal=True, rngs=_rngs())


def _lm_valid():
  return dict(vocab_size=5, d_model=8, num_heads=2, num_layers=1, mlp_dim=8, rngs=_rngs())


def _tiny_lm():
  return aj.TransformerLM(**_lm_valid())


RECIPES = {
    'additive_scores': Recipe(
        lambda: dict(query_proj=_array(B, 3), keys_proj=_array(B, T, 3), v=_array(3)),
        kinds=dict(query_proj='float_array', keys_proj='float_array', v='float_array')),
    'attend': Recipe(
        lambda: dict(scores=_array(B, T), values=_array(B, T, D)),
        samples=lambda: dict(mask=jnp.ones((B, T), bool)),
        kinds=dict(scores='float_array', values='float_array')),
    'attention_mask_from_tokens': Recipe(lambda: dict(token_mask=jnp.ones((B, T), bool)),
                                         kinds=dict(token_mask='token_mask')),
    'causal_mask': Recipe(lambda: dict(length=T)),
    'chunked_attention': Recipe(
        _qkv, samples=lambda: dict(kv_lengths=jnp.array([T, 2]), alibi_slopes=_array(H),
                                   segment_ids=(_ids(B, T), _ids(B, T)), sinks=_array(H)),
        kinds=dict(q='qkv', k='qkv', v='qkv', alibi_slopes='float_array', sinks='float_array'),
        skip=dict(difference='a (q_values, k_values) pair: DifferenceBias is swept',
                  segment_ids='a (q_ids, kv_ids) pair: segment_mask is swept')),
    'combine_masks': Recipe(lambda: dict(masks=jnp.ones((T, T), bool)),
                            call=lambda masks: aj.combine_masks(aj.causal_mask(T), masks),
                            kinds=dict(masks='masks')),
    'dot_product_attention': Recipe(
        _head, samples=lambda: dict(mask=jnp.ones((T, T), bool), bias=_array(T, T),
                                    sink=jnp.float32(0.0)),
        kinds=dict(q='float_array', k='float_array', v='float_array', sink='scalar',
                   mask='masks')),
    'dot_scores': Recipe(lambda: dict(query=_array(B, D), keys=_array(B, T, D)),
                         kinds=dict(query='float_array', keys='float_array')),
    'multi_head_attention': Recipe(
        _qkv, samples=lambda: dict(mask=aj.causal_mask(T), bias=_array(T, T), sinks=_array(H)),
        kinds=dict(q='qkv', k='qkv', v='qkv', sinks='float_array')),
    'padding_mask': Recipe(lambda: dict(lengths=jnp.array([T, 2]), max_length=T),
                           kinds=dict(lengths='lengths_alone')),
    'relative_distance': Recipe(lambda: dict(q_positions=jnp.arange(T),
                                             k_positions=jnp.arange(T)),
                                kinds=dict(q_positions='positions', k_positions='positions')),
    'scaled_dot_product_attention': Recipe(
        _qkv, samples=lambda: dict(mask=aj.causal_mask(T), bias=_array(T, T),
                                   kv_lengths=jnp.array([T, 2]), window=2, chunk_size=2,
                                   segment_ids=_ids(B, T), kv_segment_ids=_ids(B, T),
                                   q_slots=jnp.arange(T), sinks=_array(H)),
        kinds=dict(q='qkv', k='qkv', v='qkv', sinks='float_array', window='optional_count'),
        skip=dict(score_bias='a ScoreSpec: each kind is swept as a public constructor')),
    'segment_mask': Recipe(lambda: dict(q_ids=_ids(B, T), kv_ids=_ids(B, T)),
                           kinds=dict(q_ids='ids', kv_ids='ids')),
    'segment_positions': Recipe(lambda: dict(segment_ids=_ids(B, T)),
                                kinds=dict(segment_ids='positions')),
    'sliding_window_mask': Recipe(lambda: dict(q_len=T, k_len=T, window=2)),
    'stick_breaking_attention': Recipe(
        _qkv, samples=lambda: dict(mask=aj.causal_mask(T), bias=_array(T, T),
                                   q_slots=jnp.arange(T)),
        kinds=dict(q='qkv', k='qkv', v='qkv')),
    'StickBreaking': Recipe(dict),
    'DenseBias': Recipe(lambda: dict(bias=_array(1, 1, T, T)), kinds=dict(bias='dense_bias')),
    'DifferenceBias': Recipe(lambda: dict(q_values=_array(B, T, H), k_values=_array(B, T, H)),
                             kinds=dict(q_values='float_array', k_values='float_array')),
    'LinearBias': Recipe(lambda: dict(slopes=(0.5, 0.25)), kinds=dict(slopes='slopes')),
    'WindowBias': Recipe(lambda: dict(lows=(0, None), highs=(2, None)),
                         samples=lambda: dict(q_positions=jnp.arange(T)[None],
                                              k_positions=jnp.arange(T)[None]),
                         kinds=dict(q_positions='positions', k_positions='positions'),
                         skip=dict(lows='per-head bounds: WindowBias checks them (its test)',
                                   highs='per-head bounds: WindowBias checks them (its test)')),
    'AdditiveAttention': Recipe(lambda: dict(query_dim=4, key_dim=4, attention_dim=3,
                                             rngs=_rngs()),
                                kinds=dict(attention_dim='count_or_zero')),
    'MultiHeadAttention': Recipe(
        _mha_valid, samples=lambda: dict(num_kv_heads=1, sliding_window=2, chunk_size=2,
                                         max_positions=8, in_features=8),
        skip=dict(in_features='d_model under Flax\'s name: the d_model cases cover it')),
    'SelfAttention': Recipe(lambda: dict(d_model=8, d_k=4, rngs=_rngs()),
                            samples=lambda: dict(d_v=4)),
    'Seq2Seq': Recipe(lambda: dict(vocab_size=5, embed_dim=4, hidden_dim=4, attention=True,
                                   start_token=1, rngs=_rngs()),
                      kinds=dict(start_token='token')),
    'TransformerEncoder': Recipe(lambda: dict(vocab_size=5, output_size=3, d_model=8,
                                              num_heads=2, num_layers=1, mlp_dim=8,
                                              rngs=_rngs())),
    'TransformerLM': Recipe(_lm_valid, samples=lambda: dict(num_kv_heads=1),
                            kinds=dict(encoding_layers='layers'),
                            skip=dict(abacus='a dict of Abacus options (its own test)')),
    'generate': Recipe(lambda: dict(model=_tiny_lm(), prompt=jnp.ones((B, 2), jnp.int32),
                                    num_tokens=2),
                       samples=lambda: dict(prompt_lengths=jnp.array([2, 1]),
                                            positions=jnp.arange(4)[None],
                                            segment_ids=_ids(B, 2)),
                       kinds=dict(eos_id='token', pad_id='token', top_p='probability',
                                  prompt='tokens', num_tokens='count_or_zero')),
    'make_encoding': Recipe(lambda: dict(name='rope', d_model=8, num_heads=2),
                            kinds=dict(name='encoding')),
    'parse_encoding_spec': Recipe(lambda: dict(spec='rope:randomized')),
    'register_encoding': Recipe(
        lambda: dict(name='rope', cls=aj.ENCODINGS['rope']),
        kinds=dict(name='name')),
}
BAD_VALUES['token'] = [Bad('negative', -1), Bad('float', 1.5), Bad('string', '1'),
                       Bad('too_large', 1000)]
BAD_VALUES['probability'] = [Bad('zero', 0.0), Bad('above_one', 1.5), Bad('nan', math.nan),
                             Bad('string', '0.9')]
BAD_VALUES['layers'] = [Bad('negative', (-5,)), Bad('not_a_sequence', 'all'),
                        Bad('float', (0.5,))]

# Public names that are not called with arguments, each with the reason.
EXEMPT = {
    'MASK_VALUE': 'a constant',
    'ENCODINGS': 'the registry (a dict)',
    'NoBias': 'takes no argument',
    'ScoreSpec': 'the abstract base of the score specs (each kind is swept)',
    'PositionalEncoding': 'the abstract base of the encodings (make_encoding is swept)',
    'ScoreContext': 'a record the modules build for the encodings, not a user entry point',
    'attention': 'a subpackage', 'nn': 'a subpackage', 'positional': 'a subpackage',
}


def _signature(obj):
  target = obj.__init__ if isinstance(obj, type) else obj
  parameters = list(inspect.signature(target).parameters.values())
  return [p for p in parameters if p.name != 'self']


def _kind(recipe: Recipe, name: str) -> Optional[str]:
  return recipe.kinds.get(name, ARGUMENT_KINDS.get(name))


def _cases():
  for public, recipe in sorted(RECIPES.items()):
    for parameter in _signature(getattr(aj, public)):
      if parameter.name in recipe.skip or parameter.kind == parameter.VAR_KEYWORD:
        continue
      kind = _kind(recipe, parameter.name)
      for bad in BAD_VALUES.get(kind, ()):
        yield (f'{public}__{parameter.name}__{bad.label}', public, parameter.name, bad)


def _call(public, kwargs):
  recipe = RECIPES[public]
  if recipe.call is not None:
    return recipe.call(**kwargs)
  return getattr(aj, public)(**kwargs)


def _named(name, message):
  """Whether `message` names the argument (`name=`, `name `, `'name'`, ...)."""
  return name in message


class PublicBadValuesTest(parameterized.TestCase):

  def test_every_public_name_has_a_recipe(self):
    callables = [n for n in aj.__all__ if n not in EXEMPT]
    self.assertEqual([n for n in callables if n not in RECIPES], [],
                     'a public name without a recipe here: add one (or an exemption)')
    self.assertEqual(sorted(set(RECIPES) - set(aj.__all__)), [])
    missing = []
    for public, recipe in RECIPES.items():
      for parameter in _signature(getattr(aj, public)):
        if parameter.kind == parameter.VAR_KEYWORD or parameter.name in recipe.skip:
          continue
        kind = _kind(recipe, parameter.name)
        if kind is None and parameter.name not in UNSWEPT:
          missing.append(f'{public}({parameter.name})')
        elif kind is not None:
          self.assertIn(kind, BAD_VALUES, f'{public}({parameter.name})')
    self.assertEqual(missing, [], 'arguments without a kind of bad values')

  @parameterized.named_parameters(
      (f'_{public}', public) for public in sorted(RECIPES))
  def test_valid_call_is_served(self, public):
    _call(public, RECIPES[public].valid())

  @parameterized.named_parameters(*_cases())
  def test_bad_value(self, public, argument, bad):
    recipe = RECIPES[public]
    kwargs = recipe.valid()
    valid = kwargs.get(argument, recipe.samples().get(argument))
    value = bad.make(valid)
    call = dict(kwargs, **{argument: value})
    try:
      result = _call(public, call)
    except (ValueError, TypeError) as e:
      if bad.expect is not REFUSE and not bad.expect.or_refuse:
        self.fail(f'{public}({argument}={bad.label}) should be served '
                  f'({bad.expect.says}); refused: {e}')
      self.assertTrue(_named(argument, str(e)),
                      f'{public}({argument}={bad.label}): the refusal does not name '
                      f'{argument!r}: {type(e).__name__}: {e}')
      return
    if bad.expect is REFUSE:
      self.fail(f'{public}({argument}={bad.label}: {value!r:.80}) accepted silently')
    clean = (None if bad.expect is not SAME else
             _call(public, dict(kwargs, **{argument: valid}) if valid is not None else kwargs))
    self.assertTrue(bad.expect.check(result, clean),
                    f'{public}({argument}={bad.label}): served, but not {bad.expect.says}')


if __name__ == '__main__':
  absltest.main()
