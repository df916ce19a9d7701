"""`dtype` and `param_dtype`, Flax's way, on every module and encoding:
parameters stored in `param_dtype`, computation in `dtype` (None: inferred
from inputs and parameters), the float32 parts kept float32, float32 logits,
and bad values refused by name."""

import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from tests import tiers

# One encoding of each kind of parameter and computation first (a rotation,
# an additive bias, cumulative gates, a learned table, a convolution,
# Householder products): the sweeps keep these in `make test` and run the
# others in the slow tier (tests/tiers.py).
FAST = ('rope', 'alibi', 'fox', 'learned', 'mta', 'path')
ENCODINGS = FAST + tuple(sorted(set(aj.ENCODINGS) - set(FAST)))
LOW = (jnp.bfloat16, jnp.float16)
# Half an ulp of the low dtype at 1 (bfloat16: 8 significant bits, float16: 11),
# times a budget for the roundings of one layer (projections, MLP, norms).
EPS = {jnp.bfloat16: 2.0 ** -8, jnp.float16: 2.0 ** -11}
ROUNDINGS = 16


def _lm(encoding, **precision):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=2, num_layers=1, mlp_dim=32,
                          encoding=encoding, max_positions=16, rngs=nnx.Rngs(0), **precision)


def _param_dtypes(module) -> set:
  return {v.dtype for v in jax.tree.leaves(nnx.state(module, nnx.Param))}


def _modules(**precision):
  """One of each module, built with `precision`."""
  return {
      'MultiHeadAttention': aj.MultiHeadAttention(
          16, 2, causal=True, use_bias=True, encoding='fire', scalable_softmax=1.0,
          rngs=nnx.Rngs(0), **precision),
      'stick_breaking': aj.MultiHeadAttention(
          16, 2, causal=True, normalization=aj.StickBreaking(remainder='head_bias'),
          rngs=nnx.Rngs(0), **precision),
      'SelfAttention': aj.SelfAttention(16, 8, encoding='kerple', rngs=nnx.Rngs(0),
                                        **precision),
      'AdditiveAttention': aj.AdditiveAttention(8, 8, 8, rngs=nnx.Rngs(0), **precision),
      'TransformerLM': aj.TransformerLM(
          vocab_size=11, d_model=16, num_heads=2, num_layers=1, mlp_dim=32, encoding='learned',
          max_positions=16, abacus=dict(digit_tokens=tuple(range(10)), rows=12),
          rngs=nnx.Rngs(0), **precision),
      'TransformerEncoder': aj.TransformerEncoder(
          vocab_size=11, output_size=3, d_model=16, num_heads=2, num_layers=1, mlp_dim=32,
          encoding='relative', rngs=nnx.Rngs(0), **precision),
      'Seq2Seq': aj.Seq2Seq(vocab_size=7, embed_dim=8, hidden_dim=8, attention=True,
                            start_token=1, bidirectional=True, rngs=nnx.Rngs(0), **precision),
  }


class LowPrecisionModelTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters((name, name) for name in ENCODINGS)
  @tiers.fast_cases(len(FAST))
  def test_low_precision_model_is_close_to_float32(self, encoding):
    reference = _lm(encoding)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 11)
    want = reference(tokens)
    for dtype in LOW:
      model = _lm(encoding, dtype=dtype, param_dtype=jnp.float32)
      # The same parameters: float32 storage, the same initialisation.
      chex.assert_trees_all_equal(nnx.state(model, nnx.Param), nnx.state(reference, nnx.Param))
      got = model(tokens)
      self.assertEqual(got.dtype, jnp.float32)  # logits float32 whatever dtype
      chex.assert_tree_all_finite(got)
      scale = float(jnp.abs(want).max())
      np.testing.assert_allclose(got, want, atol=ROUNDINGS * EPS[dtype] * scale, rtol=0,
                                 err_msg=f'{encoding} in {jnp.dtype(dtype).name}')

  @parameterized.named_parameters((name, name) for name in ENCODINGS)
  @tiers.fast_cases(len(FAST))
  def test_every_encoding_stores_its_parameters_in_param_dtype(self, encoding):
    enc = aj.make_encoding(encoding, d_model=16, num_heads=2, max_positions=16,
                           rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    self.assertLessEqual(_param_dtypes(enc), {jnp.dtype(jnp.bfloat16)})
    model = _lm(encoding, param_dtype=jnp.bfloat16)
    self.assertEqual(_param_dtypes(model), {jnp.dtype(jnp.bfloat16)})
    # dtype None with bfloat16 parameters computes in bfloat16 (Flax's
    # inference); the logits are float32 all the same.
    logits = model(jnp.zeros((1, 4), jnp.int32))
    self.assertEqual(logits.dtype, jnp.float32)
    chex.assert_tree_all_finite(logits)

class ComputationDtypeTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('float32', jnp.float32), ('bfloat16', jnp.bfloat16),
                                  ('float16', jnp.float16))
  def test_activations_in_dtype_float32_where_promised(self, dtype):
    model = _lm('fox', dtype=dtype)
    x = jax.random.normal(jax.random.key(0), (2, 6, 16))  # float32 input
    attention = model.blocks[0].attention
    q, k = attention.encoded_queries_keys(x)
    self.assertEqual((q.dtype, k.dtype), (dtype, dtype))
    out, weights = attention(x, return_weights=True)
    self.assertEqual(out.dtype, dtype)
    self.assertEqual(weights.dtype, jnp.float32)  # softmax in float32
    self.assertEqual(attention.encoding.token_features(x.astype(dtype)).dtype,
                     jnp.float32)  # FoX's cumulative gates
    hidden = model.blocks[0].mlp_in(model.blocks[0].mlp_norm(x))
    self.assertEqual(hidden.dtype, dtype)
    self.assertEqual(model(jnp.zeros((2, 6), jnp.int32)).dtype, jnp.float32)

  @parameterized.named_parameters(('bfloat16', jnp.bfloat16), ('float16', jnp.float16))
  def test_rope_angles_stay_float32(self, dtype):
    # At position 10,000 a low-precision angle would be off by whole radians;
    # rotated in float32 and rounded once, q stays within an ulp of the
    # float32 rotation.
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='rope', dtype=dtype,
                                rngs=nnx.Rngs(0))
    ref = aj.MultiHeadAttention(16, 2, causal=True, encoding='rope', rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(3), (1, 4, 16))
    positions = np.arange(4) + 10_000
    q, _ = mha.encoded_queries_keys(x, positions=positions)
    q_ref, _ = ref.encoded_queries_keys(x, positions=positions)
    np.testing.assert_allclose(q.astype(jnp.float32), q_ref,
                               atol=ROUNDINGS * EPS[dtype] * float(jnp.abs(q_ref).max()))

  @parameterized.named_parameters(('bfloat16', jnp.bfloat16), ('float16', jnp.float16))
  def test_fully_masked_rows_stay_finite(self, dtype):
    mha = aj.MultiHeadAttention(16, 2, causal=False, encoding='alibi', dtype=dtype,
                                rngs=nnx.Rngs(0))
    mask = jnp.zeros((5, 5), bool).at[1:].set(True)  # query 0 sees nothing
    out = mha(jnp.ones((1, 5, 16)), mask=mask)
    self.assertEqual(out.dtype, dtype)
    chex.assert_tree_all_finite(out)

  def test_dtype_none_is_inferred_as_flax_infers_it(self):
    x = jnp.ones((1, 3, 16), jnp.bfloat16)
    for param_dtype in (jnp.float32, jnp.bfloat16):
      ours = aj.MultiHeadAttention(16, 2, causal=False, param_dtype=param_dtype,
                                   rngs=nnx.Rngs(0))
      theirs = nnx.MultiHeadAttention(2, 16, decode=False, param_dtype=param_dtype,
                                      rngs=nnx.Rngs(0))
      self.assertIsNone(ours.dtype)
      self.assertEqual(ours(x).dtype, theirs(x).dtype)
      self.assertEqual(ours(x).dtype, jnp.promote_types(jnp.bfloat16, param_dtype))

  @parameterized.named_parameters(('bfloat16', jnp.bfloat16), ('float16', jnp.float16))
  def test_every_module_stores_in_param_dtype_and_computes_in_dtype(self, dtype):
    modules = _modules(dtype=dtype, param_dtype=dtype)
    for name, module in modules.items():
      self.assertEqual(_param_dtypes(module), {jnp.dtype(dtype)}, name)
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    tokens = jnp.ones((2, 5), jnp.int32)
    self.assertEqual(modules['MultiHeadAttention'](x).dtype, dtype)
    self.assertEqual(modules['stick_breaking'](x).dtype, dtype)
    self.assertEqual(modules['SelfAttention'](x).dtype, dtype)
    additive = modules['AdditiveAttention']
    self.assertEqual(additive.project_keys(x[..., :8]).dtype, dtype)
    _, weights = additive(x[:, 0, :8], x[..., :8])
    self.assertEqual(weights.dtype, jnp.float32)
    self.assertEqual(modules['TransformerLM'](tokens).dtype, jnp.float32)
    self.assertEqual(modules['TransformerEncoder'](tokens).dtype, jnp.float32)
    self.assertEqual(modules['TransformerLM'].embed(tokens).dtype, dtype)
    seq2seq = modules['Seq2Seq']
    logits = seq2seq(tokens, tokens > 0, tokens)
    self.assertEqual(logits.dtype, jnp.float32)
    chex.assert_tree_all_finite(logits)
    self.assertEqual(seq2seq.embed(tokens).dtype, dtype)


class BadDtypeTest(parameterized.TestCase):

  CONSTRUCTORS = {
      'MultiHeadAttention': lambda **p: aj.MultiHeadAttention(16, 2, causal=True,
                                                              rngs=nnx.Rngs(0), **p),
      'SelfAttention': lambda **p: aj.SelfAttention(16, 8, rngs=nnx.Rngs(0), **p),
      'AdditiveAttention': lambda **p: aj.AdditiveAttention(8, 8, rngs=nnx.Rngs(0), **p),
      'TransformerLM': lambda **p: _lm('rope', **p),
      'TransformerEncoder': lambda **p: aj.TransformerEncoder(
          vocab_size=5, output_size=2, d_model=8, num_heads=2, num_layers=1, mlp_dim=8,
          rngs=nnx.Rngs(0), **p),
      'Seq2Seq': lambda **p: aj.Seq2Seq(vocab_size=5, embed_dim=4, hidden_dim=4,
                                        attention=False, start_token=1, rngs=nnx.Rngs(0), **p),
      "positional encoding 'fire'": lambda **p: aj.make_encoding(
          'fire', d_model=8, num_heads=2, rngs=nnx.Rngs(0), **p),
  }

  @parameterized.named_parameters((n.split("'")[-2] if "'" in n else n, n) for n in CONSTRUCTORS)
  def test_bad_dtypes_are_refused_naming_the_argument(self, owner):
    build = self.CONSTRUCTORS[owner]
    with self.assertRaisesRegex(ValueError, f"^{owner}: dtype='int32' \\(int32\\) is not "
                                'floating; use a floating dtype .* or None'):
      build(dtype='int32')
    with self.assertRaisesRegex(ValueError, f'^{owner}: param_dtype=.*int8.* is not floating'):
      build(param_dtype=jnp.int8)
    with self.assertRaisesRegex(TypeError, f'^{owner}: dtype=<object object at 0x[0-9a-f]+> '
                                'is not a dtype; use a floating dtype'):
      build(dtype=object())
    with self.assertRaisesRegex(TypeError, f'^{owner}: param_dtype=None is not a dtype'):
      build(param_dtype=None)

  def test_an_encoding_registered_from_outside_gets_param_dtype(self):

    class Offsets(aj.PositionalEncoding):
      """Makes its parameter with nnx.Param directly, in float32."""

      def __init__(self, num_heads):
        self.offsets = nnx.Param(jnp.arange(num_heads, dtype=jnp.float32))

      @classmethod
      def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
        del d_model, max_positions, causal, rngs
        return cls(num_heads)

      def score_contribution(self, context):
        return aj.NoBias()

    aj.register_encoding('offsets_from_outside', Offsets)
    self.addCleanup(aj.ENCODINGS.pop, 'offsets_from_outside')
    enc = aj.make_encoding('offsets_from_outside', d_model=8, num_heads=2,
                           param_dtype=jnp.bfloat16)
    self.assertEqual(enc.offsets[...].dtype, jnp.bfloat16)
    chex.assert_trees_all_equal(enc.offsets[...], jnp.arange(2, dtype=jnp.bfloat16))
    model = _lm('offsets_from_outside', param_dtype=jnp.float16)
    self.assertEqual(_param_dtypes(model), {jnp.dtype(jnp.float16)})

  def test_build_signatures_list_only_the_encodings_options(self):
    # The lab reads a build's keywords as the encoding's options (its configs
    # and run records): the dtypes reach it through make_encoding's scope.
    for name, cls in aj.ENCODINGS.items():
      parameters = inspect.signature(cls.build).parameters
      self.assertNotIn('dtype', parameters, name)
      self.assertNotIn('param_dtype', parameters, name)


if __name__ == '__main__':
  absltest.main()
