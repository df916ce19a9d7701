"""NNX attention modules: against Flax and NumPy, causality, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from tests import references as ref
from tests import tiers

ENCODINGS = sorted(aj.ENCODINGS)
# Encodings that act inside attention; the others are added to the embeddings.
IN_ATTENTION = [e for e in ENCODINGS if not aj.positional.embedding_only(aj.ENCODINGS[e])]


class MultiHeadAttentionModuleTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('no_mask', None), ('causal', 'causal'))
  def test_equals_flax_with_the_same_weights(self, mask_kind):
    d_model, heads, t = 32, 4, 7
    ours = aj.MultiHeadAttention(d_model, heads, causal=False, use_bias=True,
                                 rngs=nnx.Rngs(0))
    theirs = nnx.MultiHeadAttention(heads, d_model, decode=False, rngs=nnx.Rngs(1))
    for mine, flax_name in (('W_Q', 'query'), ('W_K', 'key'), ('W_V', 'value'), ('W_O', 'out')):
      src = getattr(theirs, flax_name)
      getattr(ours, mine).kernel[...] = src.kernel[...]
      getattr(ours, mine).bias[...] = src.bias[...]
    x = jax.random.normal(jax.random.key(2), (3, t, d_model))
    mask = None if mask_kind is None else aj.causal_mask(t)
    out, weights = ours(x, mask=mask, return_weights=True)
    want = theirs(x, mask=None if mask is None else mask[None, None])
    chex.assert_shape(weights, (3, heads, t, t))
    chex.assert_trees_all_close(out, want, atol=1e-5, rtol=1e-5)

  def test_heads_must_divide_d_model(self):
    with self.assertRaisesRegex(ValueError, 'num_heads=3 must be >= 1 and divide d_model=16'):
      aj.MultiHeadAttention(16, 3, causal=True, rngs=nnx.Rngs(0))

  def test_bad_input_width(self):
    mha = aj.MultiHeadAttention(16, 4, causal=True, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'x must be \[batch, length, 16\], got \(2, 3, 8\)'):
      mha(jnp.zeros((2, 3, 8)))

  def test_cross_attention_shapes(self):
    mha = aj.MultiHeadAttention(16, 4, encoding='rope', causal=False, rngs=nnx.Rngs(0))
    out, weights = mha(jnp.ones((2, 3, 16)), jnp.ones((2, 9, 16)), return_weights=True)
    chex.assert_shape(out, (2, 3, 16))
    chex.assert_shape(weights, (2, 4, 3, 9))

  def test_rope_rotates_q_and_k_inside(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='rope', rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(3), (1, 5, 16))
    _, weights = mha(x, return_weights=True)
    q = aj.positional.apply_rope(mha.W_Q(x), np.arange(5))
    k = aj.positional.apply_rope(mha.W_K(x), np.arange(5))
    _, want = aj.multi_head_attention(q, k, mha.W_V(x), mask=aj.causal_mask(5))
    chex.assert_trees_all_close(weights, want, atol=1e-6)
    # Shifting every position by the same offset changes nothing.
    _, shifted = mha(x, positions=np.arange(5) + 20_000, return_weights=True)
    chex.assert_trees_all_close(shifted, weights, atol=1e-5)

  @parameterized.named_parameters(
      (f'{e}_{jnp.dtype(d).name}', d, e)
      for e in IN_ATTENTION for d in (jnp.float32, jnp.bfloat16, jnp.float16))
  @tiers.fast_cases(6)  # two encodings in every dtype; every other encoding in the slow tier
  def test_dtypes(self, dtype, encoding):
    mha = aj.MultiHeadAttention(16, 4, causal=True, encoding=encoding, dtype=dtype,
                                max_positions=8, rngs=nnx.Rngs(0))
    out, weights = nnx.jit(lambda m, x: m(x, mask=aj.causal_mask(6), return_weights=True))(
        mha, jnp.ones((2, 6, 16), dtype))
    self.assertEqual(out.dtype, dtype)
    self.assertEqual(weights.dtype, jnp.float32)
    chex.assert_tree_all_finite((out, weights))


class SelfAttentionModuleTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_the_lesson_formula(self):
    attn = aj.SelfAttention(d_model=8, d_k=4, d_v=3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(4), (2, 5, 8))
    mask = aj.causal_mask(5)
    out, weights = self.variant(lambda x: attn(x, mask=mask, return_weights=True))(x)
    chex.assert_shape(out, (2, 5, 3))
    chex.assert_shape(weights, (2, 5, 5))
    for b in range(2):
      q, k, v = (np.asarray(w(x)[b]) for w in (attn.W_Q, attn.W_K, attn.W_V))
      want_out, want_w = ref.attention(q, k, v, mask=np.asarray(mask))
      np.testing.assert_allclose(out[b], want_out, atol=1e-5)
      np.testing.assert_allclose(weights[b], want_w, atol=1e-6)

  def test_lesson_shapes(self):
    attn = aj.SelfAttention(d_model=64, d_k=32, rngs=nnx.Rngs(0))
    out, weights = attn(jnp.ones((4, 10, 64)), return_weights=True)
    chex.assert_shape(out, (4, 10, 32))
    chex.assert_shape(weights, (4, 10, 10))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


class CausalityTest(parameterized.TestCase):
  """The output at t must not depend on inputs after t, whatever the encoding."""

  @parameterized.named_parameters((e, e) for e in ENCODINGS)
  @tiers.fast_cases(8)
  def test_no_gradient_from_the_future(self, encoding):
    t, d = 6, 16
    enc = aj.make_encoding(encoding, d_model=d, num_heads=4, max_positions=t, rngs=nnx.Rngs(0))
    mha = aj.MultiHeadAttention(d, 4, causal=True, encoding=enc if enc.acts_in_attention else None,
                                rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(5), (1, t, d))

    def outputs(x):  # [T]: each position's output, summed over its features
      h = enc.add_to_embeddings(x, np.arange(t))
      return jnp.sum(mha(h)[0], axis=-1)  # causal by construction, no mask given

    # Row i: the gradient of output i with respect to every input, one
    # compiled reverse pass for all rows.
    norms = jnp.linalg.norm(jax.jit(jax.jacrev(outputs))(x)[:, 0], axis=-1)  # [T out, T in]
    for i in range(t):
      np.testing.assert_array_equal(norms[i, i + 1:], 0.0)
      self.assertGreater(float(norms[i, i]), 0.0)  # the test can see a dependence


class CausalityIsOnePropertyTest(chex.TestCase, parameterized.TestCase):
  """The module's `causal` sets both the mask and the encoding's bias."""

  def _alibi_weights(self, causal):
    mha = aj.MultiHeadAttention(16, 2, encoding='alibi', causal=causal, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(6), (1, 5, 16))
    out, weights = mha(x, return_weights=True)
    q, k, v = mha.W_Q(x), mha.W_K(x), mha.W_V(x)
    return mha, x, out, weights, (q, k, v)

  def test_default_alibi_module_is_causal(self):
    _, _, _, weights, (q, k, v) = self._alibi_weights(causal=True)
    upper = np.triu(np.ones((5, 5), bool), 1)
    np.testing.assert_array_equal(np.asarray(weights)[0][:, upper], 0.0)
    bias = aj.positional.alibi_bias(2, 5, 5, causal=True)[None]  # -slope·(i - j)
    _, want = aj.multi_head_attention(q, k, v, mask=aj.causal_mask(5), bias=bias)
    chex.assert_trees_all_close(weights, want, atol=1e-6)

  def test_bidirectional_alibi_uses_the_absolute_distance(self):
    _, _, _, weights, (q, k, v) = self._alibi_weights(causal=False)
    self.assertTrue(np.all(np.asarray(weights)[0, :, 0, 4] > 0.0))  # sees the future
    slopes = aj.positional.alibi_slopes(2)
    distance = np.abs(np.arange(5)[:, None] - np.arange(5)[None, :])
    bias = -slopes[:, None, None] * distance  # -slope·|i - j|
    _, want = aj.multi_head_attention(q, k, v, bias=jnp.asarray(bias[None], jnp.float32))
    chex.assert_trees_all_close(weights, want, atol=1e-6)

  def test_the_call_cannot_override_causality(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='alibi', rngs=nnx.Rngs(0))
    with self.assertRaises(TypeError):
      mha(jnp.ones((1, 4, 16)), causal=False)  # pylint: disable=unexpected-keyword-arg

  def test_encoding_and_module_must_agree(self):
    enc = aj.make_encoding('alibi', d_model=16, num_heads=2, causal=False)
    with self.assertRaisesRegex(ValueError, r'ALiBi was built with causal=False but '
                                r'MultiHeadAttention has causal=True'):
      aj.MultiHeadAttention(16, 2, causal=True, encoding=enc, rngs=nnx.Rngs(0))
    aj.MultiHeadAttention(16, 2, encoding=enc, causal=False, rngs=nnx.Rngs(0))  # agrees

  def test_a_bidirectional_module_does_not_decode(self):
    mha = aj.MultiHeadAttention(16, 2, causal=False, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'extend .* is causal attention, but this module '
                                'has causal=False'):
      mha.extend(jnp.ones((1, 2, 16)), mha.init_cache(1, 4), 0)

  def test_causal_cross_attention_is_an_error(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'build cross-attention with causal=False'):
      mha(jnp.ones((1, 3, 16)), jnp.ones((1, 5, 16)))

  def test_output_only_unless_weights_are_asked_for(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, rngs=nnx.Rngs(0))
    out = mha(jnp.ones((1, 4, 16)))
    chex.assert_shape(out, (1, 4, 16))
    self.assertEqual(mha.implementation, 'auto')


class FlaxCallTest(chex.TestCase, parameterized.TestCase):
  """Flax's call, `module(inputs_q, inputs_k, inputs_v, is_causal=...)`."""

  @parameterized.parameters('none', 'rope', 'alibi', 'mta', 'cope')  # mta, cope: q_slots
  def test_flax_call_forms_are_self_attention(self, encoding):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding=encoding, max_positions=8,
                                rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(4), (2, 5, 16))
    want = mha(x)
    for got in (mha(x, x, x), mha(x, x), mha(inputs_q=x), mha(inputs_q=x, inputs_k=x),
                mha(x, inputs_v=x), mha(x, is_causal=True)):
      chex.assert_trees_all_equal(got, want)
    chex.assert_trees_all_equal(nnx.jit(lambda m, x: m(x, x, x))(mha, x),
                                nnx.jit(lambda m, x: m(x))(mha, x))

  def test_flax_call_forms_of_cross_attention(self):
    mha = aj.MultiHeadAttention(16, 2, causal=False, encoding='rope', rngs=nnx.Rngs(0))
    x, c = jnp.ones((2, 3, 16)), jax.random.normal(jax.random.key(5), (2, 9, 16))
    want = mha(x, c)
    for got in (mha(x, c, c), mha(inputs_q=x, inputs_k=c), mha(x, inputs_k=c, inputs_v=c),
                mha(x, c, is_causal=False)):
      chex.assert_trees_all_equal(got, want)

  def test_flax_decode_call_with_the_same_inputs(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='rope', rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(6), (1, 4, 16))
    mha.init_cache(x.shape)
    chex.assert_trees_all_close(mha(x, x, x, decode=True), mha(x), atol=1e-6)

  @parameterized.named_parameters(
      ('inputs_v_other', dict(inputs_v='other'), r'^inputs_v must be the keys\' input itself '
       r'\(context, Flax\'s inputs_k; default x\).*no separate value input\.$'),
      ('inputs_v_not_keys', dict(context='x', inputs_v='other'), r'^inputs_v must be'),
      ('x_and_inputs_q', dict(inputs_q='x'), r'^x and inputs_q= name the same input'),
      ('context_and_inputs_k', dict(context='x', inputs_k='x'),
       r'^context and inputs_k= name the same input'),
      ('no_queries', dict(x=None, inputs_k='x'), r'^MultiHeadAttention needs the queries\' '
       r'input: x \(positional\) or inputs_q='),
      ('is_causal_disagrees', dict(is_causal=False), r'^is_causal=False but this module has '
       r'causal=True: causality is set at construction \(it also picks the encoding\'s '
       r'bias\); build it with causal=False\.$'))
  def test_flax_call_errors_name_ours(self, arguments, message):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding='alibi', rngs=nnx.Rngs(0))
    named = {'x': jnp.ones((1, 4, 16)), 'other': jnp.ones((1, 4, 16))}  # two arrays
    arguments = {k: named.get(v, v) for k, v in {'x': 'x', **arguments}.items()}
    with self.assertRaisesRegex(ValueError, message):
      mha(**arguments)

  def test_a_causal_flax_call_on_an_encoder_is_refused(self):
    mha = aj.MultiHeadAttention(16, 2, causal=False, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'is_causal=True but this module has '
                                r'causal=False.*build it with causal=True'):
      mha(jnp.ones((1, 4, 16)), is_causal=True)


class _OnlyEmbeddings(aj.PositionalEncoding):

  def add_to_embeddings(self, x, positions):
    return x + 1.0


class _OnlyDenseBias(aj.PositionalEncoding):
  """A user encoding written against the score hook alone, with a dense
  bias `[H, T_q, T_k]` (`dense_spec` makes it rank 4)."""

  def score_contribution(self, context):
    d = aj.relative_distance(context.q_positions, context.k_positions).astype(jnp.float32)
    return aj.positional.dense_spec(jnp.stack([-d, -2.0 * d]), 'a user bias')


def _spec(encoding, p):
  """What an encoding adds at positions p, asked as a module asks it."""
  q = jnp.zeros((1, len(p), 2, 8))
  return encoding.score_contribution(aj.ScoreContext(q=q, k=q, q_positions=p, k_positions=p))


class EncodingHooksTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('sinusoidal', 'sinusoidal', "'sinusoidal'"), ('learned', 'learned', "'learned'"),
      ('user_embedding_encoding', _OnlyEmbeddings(), '_OnlyEmbeddings'))
  def test_embedding_encodings_are_refused_by_attention(self, encoding, label):
    for make in (lambda: aj.MultiHeadAttention(16, 2, causal=True, encoding=encoding,
                                               rngs=nnx.Rngs(0)),
                 lambda: aj.SelfAttention(16, 8, encoding=encoding, rngs=nnx.Rngs(0))):
      with self.assertRaisesRegex(ValueError, f'encoding {label} is added to the embeddings.*'
                                  r'TransformerLM\(encoding=.*add_to_embeddings\(x, positions\)'):
        make()

  def test_a_subclass_with_only_a_dense_score_contribution_works(self):
    mha = aj.MultiHeadAttention(16, 2, causal=True, encoding=_OnlyDenseBias(), rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(7), (1, 5, 16))
    _, weights = mha(x, return_weights=True)
    q, k, v = mha.W_Q(x), mha.W_K(x), mha.W_V(x)
    spec = _spec(_OnlyDenseBias(), np.arange(5))
    self.assertIsInstance(spec, aj.DenseBias)
    _, want = aj.multi_head_attention(q, k, v, mask=aj.causal_mask(5), bias=spec.bias)
    chex.assert_trees_all_close(weights, want, atol=1e-6)

  def test_alibi_score_contribution_is_linear_only_when_it_can_be(self):
    causal = aj.make_encoding('alibi', d_model=16, num_heads=2)
    p = np.arange(4)
    self.assertIsInstance(_spec(causal, p), aj.LinearBias)
    self.assertIsInstance(_spec(causal, p + 3), aj.DenseBias)
    symmetric = aj.make_encoding('alibi', d_model=16, num_heads=2, causal=False)
    self.assertIsInstance(_spec(symmetric, p), aj.DenseBias)
    chex.assert_shape(symmetric.attention_bias(p, p), (1, 2, 4, 4))


class LinenBridgeTest(absltest.TestCase):

  def test_usable_from_linen(self):
    from flax.nnx import bridge  # pylint: disable=g-import-not-at-top
    layer = bridge.to_linen(aj.MultiHeadAttention, 16, 4, causal=True, encoding='alibi')
    x = jnp.ones((2, 5, 16))
    variables = layer.init(jax.random.key(0), x)
    out = layer.apply(variables, x)
    chex.assert_shape(out, (2, 5, 16))
    _, weights = layer.apply(variables, x, return_weights=True)
    chex.assert_shape(weights, (2, 4, 5, 5))


if __name__ == '__main__':
  absltest.main()
