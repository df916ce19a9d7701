"""The modules as a Flax NNX user expects them: Flax's keyword names and
kernels, dropout with `deterministic`, sown weights, the stateful decode
protocol, and clear errors (cache overflow under jit, out-of-vocabulary
ids, models without the cache protocol, encoding modifiers)."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.lab import tasks as lab_tasks
from attention_jax.lab.tasks import coupling as lab_coupling
from attention_jax.nn.cache import check_cache
from attention_jax.nn.transformer import TransformerLM

D, H = 16, 2


def _x(shape=(2, 5, D), dtype=jnp.float32, seed=0):
  return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def _lm(encoding='rope', **options):
  return TransformerLM(vocab_size=11, d_model=D, num_heads=H, num_layers=1, mlp_dim=16,
                       encoding=encoding, rngs=nnx.Rngs(0), **options)


class FlaxNamesTest(chex.TestCase, parameterized.TestCase):

  def test_flax_keywords_build_the_same_module(self):
    ours = aj.MultiHeadAttention(D, H, causal=True, rngs=nnx.Rngs(0))
    flax_way = aj.MultiHeadAttention(num_heads=H, in_features=D, causal=True, rngs=nnx.Rngs(0))
    chex.assert_trees_all_equal(nnx.state(ours), nnx.state(flax_way))
    self.assertEqual((flax_way.in_features, flax_way.qkv_features, flax_way.out_features),
                     (D, D, D))

  @parameterized.parameters(
      (dict(d_model=D, num_heads=H),), (dict(num_heads=H, in_features=D),))
  def test_construction_without_causal_is_refused(self, sizes):
    with self.assertRaisesRegex(ValueError, '^' + re.escape(
        'MultiHeadAttention needs causal=: pass causal=True (decoder: query i sees keys j <= '
        'i) or causal=False (encoder / cross-attention, as flax.nnx.MultiHeadAttention '
        'computes without a mask).') + '$'):
      aj.MultiHeadAttention(**sizes, use_bias=True, rngs=nnx.Rngs(0))

  @parameterized.parameters(jnp.float32, jnp.bfloat16)
  def test_kernels_match_flax_multi_head_attention(self, dtype):
    ours = aj.MultiHeadAttention(num_heads=H, in_features=D, causal=False, use_bias=True,
                                 dtype=dtype, rngs=nnx.Rngs(0))
    flax_mha = nnx.MultiHeadAttention(num_heads=H, in_features=D, decode=False, dtype=dtype,
                                      rngs=nnx.Rngs(1))
    for mine, theirs in (('W_Q', 'query'), ('W_K', 'key'), ('W_V', 'value'), ('W_O', 'out')):
      getattr(flax_mha, theirs).kernel[...] = getattr(ours, mine).kernel[...]
      getattr(flax_mha, theirs).bias[...] = getattr(ours, mine).bias[...]
    x = _x(dtype=dtype)
    tol = 1e-5 if dtype == jnp.float32 else 5e-2
    chex.assert_trees_all_close(ours(x).astype(jnp.float32),
                                flax_mha(x).astype(jnp.float32), atol=tol, rtol=tol)

  def test_flax_positional_order_names_the_order(self):
    with self.assertRaisesRegex(ValueError, r'num_heads=64 must .* divide d_model=4.*'
                                r'MultiHeadAttention\(d_model, num_heads\).*in_features'):
      aj.MultiHeadAttention(4, 64, causal=True, rngs=nnx.Rngs(0))

  @parameterized.parameters(
      (dict(d_model=D, num_heads=H, in_features=D), r'd_model=16 and in_features=16'),
      (dict(num_heads=H), r'needs its width'),
      (dict(in_features=D), r'needs num_heads'),
      (dict(in_features=D, num_heads=H, qkv_features=32), r'qkv_features=32'),
      (dict(in_features=D, num_heads=H, dropout_rate=1.0), r'dropout_rate=1.0 must be in'),
      (dict(in_features=D, num_heads=H, encoding=aj.positional.NoPE(),
            encoding_options={'base': 2.0}), r'encoding_options=.*not a name'),
  )
  def test_bad_construction_is_a_clear_error(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.MultiHeadAttention(causal=True, rngs=nnx.Rngs(0), **options)

  def test_encoding_options_reach_the_encoding(self):
    mha = aj.MultiHeadAttention(D, H, causal=True, encoding='rope',
                                encoding_options={'base': 500.0}, rngs=nnx.Rngs(0))
    self.assertEqual(mha.positional.base, 500.0)

  def test_out_and_kv_features(self):
    mha = aj.MultiHeadAttention(num_heads=H, in_features=D, out_features=6,
                                in_kv_features=10, causal=False, rngs=nnx.Rngs(0))
    chex.assert_shape(mha(_x(), _x((2, 7, 10))), (2, 5, 6))

  def test_sown_weights_are_the_returned_weights(self):
    mha = aj.MultiHeadAttention(D, H, causal=True, encoding='alibi', rngs=nnx.Rngs(0))
    out, weights = mha(_x(), return_weights=True)
    sown_out, intermediates = nnx.capture(mha, nnx.Intermediate)(_x(), sow_weights=True)
    (sown,) = intermediates['attention_weights'].get_value()
    chex.assert_trees_all_equal(sown, weights)
    chex.assert_trees_all_close(sown_out, out)


class DropoutTest(chex.TestCase, parameterized.TestCase):

  def test_rate_zero_changes_nothing_and_needs_no_rng(self):
    plain, zero = _lm(), _lm(dropout_rate=0.0, deterministic=False)
    chex.assert_trees_all_equal(nnx.state(plain), nnx.state(zero))
    tokens = jnp.arange(12).reshape(2, 6) % 11
    chex.assert_trees_all_equal(plain(tokens), zero(tokens))

  def test_attention_weights_dropout_follows_train_and_eval(self):
    plain = aj.MultiHeadAttention(D, H, causal=True, rngs=nnx.Rngs(0))
    mha = aj.MultiHeadAttention(D, H, causal=True, dropout_rate=0.5, rngs=nnx.Rngs(0))
    x = _x()
    with self.assertRaisesRegex(ValueError, r'dropout_rate=0.5 needs .*deterministic'):
      mha(x)
    mha.eval()
    chex.assert_trees_all_equal(mha(x), plain(x))  # same parameters: forked after them
    mha.train()
    a, b = mha(x), mha(x)
    self.assertFalse(np.allclose(a, b))  # a fresh mask per call
    self.assertFalse(np.allclose(a, plain(x)))
    chex.assert_trees_all_equal(mha(x, deterministic=True), plain(x))  # the call wins

  def test_dropped_weights_give_the_output(self):
    # V = I (d_model = T = 4, one head, identity projections): the output is
    # the dropped weights, zeros where dropped and w / (1 - rate) elsewhere.
    mha = aj.MultiHeadAttention(4, 1, causal=False, dropout_rate=0.5,
                                broadcast_dropout=False, deterministic=False,
                                rngs=nnx.Rngs(0))
    for w in (mha.W_V, mha.W_O):
      w.kernel[...] = jnp.eye(4).reshape(w.kernel.shape)
    x = jnp.eye(4)[None]
    _, weights = mha(x, deterministic=True, return_weights=True)
    out = np.asarray(mha(x))[0]
    kept = out != 0
    self.assertTrue(kept.any() and not kept.all())
    np.testing.assert_allclose(out[kept], 2 * np.asarray(weights)[0, 0][kept], rtol=1e-5)

  def test_dropping_needs_the_dense_kernel(self):
    mha = aj.MultiHeadAttention(D, H, causal=True, dropout_rate=0.1, deterministic=False,
                                implementation='chunked', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r"only the dense kernel.*'chunked'"):
      mha(_x())
    mha(_x(), deterministic=True)  # the chunked kernel serves evaluation

  def test_model_dropout_on_weights_and_residuals(self):
    model = _lm(dropout_rate=0.3)
    tokens = jnp.arange(12).reshape(2, 6) % 11
    model.eval()
    chex.assert_trees_all_equal(model(tokens), model(tokens))
    model.train()
    self.assertFalse(np.allclose(model(tokens), model(tokens)))
    self.assertTrue(all(b.deterministic is False and b.attention.deterministic is False
                        for b in model.blocks))


class DecodeTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters('rope', 'fox')  # fox: cached token features
  def test_flax_decode_equals_the_full_pass(self, encoding):
    mha = aj.MultiHeadAttention(D, H, causal=True, encoding=encoding, rngs=nnx.Rngs(0))
    x = _x((2, 6, D))
    want = mha(x)
    mha.init_cache(x.shape)
    step = nnx.jit(lambda m, t: m(t, decode=True))
    got = [mha(x[:, :2], decode=True)] + [step(mha, x[:, i:i + 1]) for i in range(2, 6)]
    chex.assert_trees_all_close(jnp.concatenate(got, 1), want, atol=1e-5)
    self.assertEqual(int(mha.cache_index[...]), 6)

  def test_decode_without_cache_is_a_clear_error(self):
    mha = aj.MultiHeadAttention(D, H, causal=True, decode=True, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'call init_cache\(\(batch, cache_size'):
      mha(_x())


class CacheOverflowTest(chex.TestCase):

  def test_same_message_with_and_without_jit(self):
    mha = aj.MultiHeadAttention(D, H, causal=True, rngs=nnx.Rngs(0))
    x, cache = _x((1, 2, D)), mha.init_cache(1, 4)
    with self.assertRaises(ValueError) as eager:
      mha.extend(x, cache, 3)
    out, cache = nnx.jit(lambda m, x, c, s: m.extend(x, c, s))(mha, x, cache, jnp.int32(3))
    self.assertTrue(np.isnan(np.asarray(out)).all())
    with self.assertRaisesRegex(ValueError, '^' + re.escape(str(eager.exception)) + '$'):
      check_cache(cache)
    self.assertIn('slots 3 … 4 but the cache has 4 slots', str(eager.exception))

  def test_model_cache_in_range_is_unflagged_and_overflow_flagged(self):
    model, tokens = _lm(), jnp.ones((1, 2), jnp.int32)
    step = jax.jit(lambda t, c, i: model.extend(t, c, i))
    logits, cache = step(tokens, model.init_cache(1, 4), 2)
    check_cache(cache)  # in range: nothing to say
    self.assertTrue(np.isfinite(np.asarray(logits)).all())
    logits, cache = step(tokens, cache, 3)
    self.assertTrue(np.isnan(np.asarray(logits)).all())
    with self.assertRaisesRegex(ValueError, r'slots 3 … 4 but the cache has 4 slots'):
      check_cache(cache)


  def test_check_cache_reads_a_module_stateful_cache(self):
    mha = aj.MultiHeadAttention(D, H, causal=True, encoding='fox', rngs=nnx.Rngs(0))
    mha.init_cache((1, 4, D))
    step = nnx.jit(lambda m, t: m(t, decode=True))
    self.assertTrue(np.isfinite(np.asarray(step(mha, _x((1, 2, D))))).all())
    aj.nn.check_cache(mha)  # slots 0 … 1: in range
    with self.assertRaises(ValueError) as eager:
      nnx.clone(mha)(_x((1, 3, D)), decode=True)
    self.assertTrue(np.isnan(np.asarray(step(mha, _x((1, 3, D))))).all())
    with self.assertRaisesRegex(ValueError, '^' + re.escape(str(eager.exception)) + '$'):
      aj.nn.check_cache(mha)
    self.assertIn('slots 2 … 4 but the cache has 4 slots', str(eager.exception))

  def test_check_cache_walks_a_model_for_stateful_caches(self):
    model = TransformerLM(vocab_size=11, d_model=D, num_heads=H, num_layers=2, mlp_dim=16,
                          encoding='rope', rngs=nnx.Rngs(0))
    for block in model.blocks:
      block.attention.init_cache((1, 4, D))
    step = nnx.jit(lambda m, h: m.blocks[1].attention(h, decode=True))
    step(model, _x((1, 3, D)))
    aj.nn.check_cache(model)
    step(model, _x((1, 3, D)))  # slots 3 … 5 of the second layer's cache
    with self.assertRaisesRegex(ValueError, r'^extend writes cache slots 3 … 5 but the cache '
                                r'has 4 slots \(0 … 3\); make it longer'):
      aj.nn.check_cache(model)

  def test_check_cache_of_a_module_without_a_stateful_cache(self):
    for module in (aj.MultiHeadAttention(D, H, causal=True, rngs=nnx.Rngs(0)), _lm()):
      with self.assertRaisesRegex(ValueError, rf'^check_cache\({type(module).__name__}\) '
                                  r'found no stateful cache.*call init_cache\(\(batch, '
                                  r'cache_size, d_model\)\)'):
        aj.nn.check_cache(module)


class FlaxParamsTest(chex.TestCase, parameterized.TestCase):
  """`nn.from_flax` / `nn.to_flax` against a real `flax.nnx.MultiHeadAttention`."""

  @parameterized.product(use_bias=(True, False), dtype=(jnp.float32, jnp.bfloat16),
                         num_kv_heads=(None, 1))
  def test_converted_parameters_give_flax_outputs(self, use_bias, dtype, num_kv_heads):
    sizes = dict(num_heads=H, in_features=D, num_kv_heads=num_kv_heads, use_bias=use_bias,
                 dtype=dtype, param_dtype=dtype)
    flax_mha = nnx.MultiHeadAttention(**sizes, decode=False, rngs=nnx.Rngs(1))
    ours = aj.MultiHeadAttention(**sizes, causal=False, rngs=nnx.Rngs(0))
    other = aj.MultiHeadAttention(**sizes, causal=False, rngs=nnx.Rngs(2))
    for name in ('query', 'key', 'value', 'out') if use_bias else ():  # biases start at 0
      bias = getattr(flax_mha, name).bias
      bias[...] = _x(bias.shape, dtype, seed=3)
    params = lambda m: [v[...] for _, v in nnx.to_flat_state(nnx.state(m, nnx.Param))]
    count = lambda m: sum(p.size for p in params(m))
    self.assertEqual(count(ours), count(flax_mha))
    x, tol = _x(dtype=dtype), 1e-5 if dtype == jnp.float32 else 5e-2
    f32 = lambda a: np.asarray(a, np.float32)
    self.assertFalse(np.allclose(f32(ours(x)), f32(flax_mha(x)), atol=tol, rtol=tol))
    nnx.update(ours, aj.nn.from_flax(nnx.state(flax_mha, nnx.Param), ours))
    chex.assert_trees_all_close(f32(ours(x)), f32(flax_mha(x)), atol=tol, rtol=tol)
    self.assertFalse(np.allclose(f32(other(x)), f32(flax_mha(x)), atol=tol, rtol=tol))
    nnx.update(flax_mha, aj.nn.to_flax(nnx.state(other, nnx.Param), flax_mha))
    chex.assert_trees_all_close(f32(flax_mha(x)), f32(other(x)), atol=tol, rtol=tol)
    self.assertEqual({p.dtype for p in params(ours)}, {jnp.dtype(dtype)})

  def test_a_causal_module_is_flax_with_is_causal(self):
    ours = aj.MultiHeadAttention(D, H, causal=True, use_bias=True, rngs=nnx.Rngs(0))
    flax_mha = nnx.MultiHeadAttention(H, D, decode=False, rngs=nnx.Rngs(1))
    nnx.update(flax_mha, aj.nn.to_flax(nnx.state(ours, nnx.Param), flax_mha))
    chex.assert_trees_all_close(flax_mha(_x(), is_causal=True), ours(_x()), atol=1e-5)

  def test_values_take_the_target_dtypes(self):
    flax_mha = nnx.MultiHeadAttention(H, D, decode=False, rngs=nnx.Rngs(1))
    ours = aj.MultiHeadAttention(D, H, causal=False, use_bias=True, param_dtype=jnp.bfloat16,
                                 rngs=nnx.Rngs(0))
    state = aj.nn.from_flax(nnx.state(flax_mha, nnx.Param), ours)
    self.assertEqual({v[...].dtype for _, v in nnx.to_flat_state(state)}, {jnp.dtype('bfloat16')})
    chex.assert_trees_all_equal(state['W_Q']['kernel'][...],
                                flax_mha.query.kernel[...].astype(jnp.bfloat16))

  @parameterized.named_parameters(
      ('flax_bias_into_no_bias', dict(), dict(use_bias=False), r"^Flax's \w+\.bias has no "
       r'place in the MultiHeadAttention, built with use_bias=False: build it with '
       r'use_bias=True\.$'),
      ('no_flax_bias_into_bias', dict(use_bias=False), dict(), r'^the MultiHeadAttention has '
       r'W_.\.bias but the Flax state has no bias .*with use_bias=False\.$'),
      ('normalize_qk', dict(normalize_qk=True), dict(), r"^key_ln\.scale is Flax's "
       r'normalize_qk LayerNorm, .*normalize_qk=False converts\.$'),
      ('shape', dict(num_kv_heads=1), dict(), r"^Flax's key\.bias is \(1, 8\) but the "
       r"MultiHeadAttention's W_K\.bias is \(2, 8\): build both with the same sizes"))
  def test_from_flax_refusals(self, flax_options, our_options, message):
    flax_mha = nnx.MultiHeadAttention(H, D, **flax_options, decode=False, rngs=nnx.Rngs(1))
    ours = aj.MultiHeadAttention(D, H, causal=False, **{'use_bias': True, **our_options},
                                 rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, message):
      aj.nn.from_flax(nnx.state(flax_mha, nnx.Param), ours)

  @parameterized.named_parameters(
      ('bias_into_no_bias', dict(), dict(use_bias=False), r"^MultiHeadAttention's W_.\.bias "
       r'has no place in the flax.nnx.MultiHeadAttention, built with use_bias=False: build '
       r'it with use_bias=True\.$'),
      ('no_bias_into_bias', dict(use_bias=False), dict(), r'^the flax.nnx.MultiHeadAttention '
       r'has \w+\.bias but the MultiHeadAttention state has no bias'),
      ('encoding', dict(encoding='cope', max_positions=8), dict(), r'^positional\.pos_emb '
       r"\(the encoding's parameter\) has no place in flax.nnx.MultiHeadAttention"),
      ('scalable_softmax', dict(scalable_softmax=1.0), dict(), r'^ssmax_scale \(scalable '
       r'softmax\) has no place .*scalable_softmax=None converts\.$'),
      ('normalize_qk', dict(), dict(normalize_qk=True), r'^the flax.nnx.MultiHeadAttention '
       r'has key_ln\.scale \(normalize_qk=True\).*build it with normalize_qk=False\.$'),
      ('shape', dict(num_kv_heads=1), dict(), r"^MultiHeadAttention's W_K\.bias is \(1, 8\) "
       r"but the flax.nnx.MultiHeadAttention's key\.bias is \(2, 8\): build both with"))
  def test_to_flax_refusals(self, our_options, flax_options, message):
    ours = aj.MultiHeadAttention(D, H, causal=True, **{'use_bias': True, **our_options},
                                 rngs=nnx.Rngs(0))
    flax_mha = nnx.MultiHeadAttention(H, D, **flax_options, decode=False, rngs=nnx.Rngs(1))
    with self.assertRaisesRegex(ValueError, message):
      aj.nn.to_flax(nnx.state(ours, nnx.Param), flax_mha)


class ModelInputsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(11, -1)
  def test_static_out_of_vocabulary_ids_are_refused(self, bad):
    model = _lm()
    with self.assertRaisesRegex(ValueError, rf'token id {bad} is outside the vocabulary '
                                r'0 … 10 \(vocab_size=11\)'):
      model(jnp.array([[1, bad, 2]]))
    with self.assertRaisesRegex(ValueError, rf'token id {bad}'):
      model.extend(jnp.array([[bad]]), model.init_cache(1, 3), 0)

  def test_traced_out_of_vocabulary_ids_give_nan_logits(self):
    logits = np.asarray(jax.jit(_lm())(jnp.array([[1, 2, 11, 3], [1, 2, 3, 4]])))
    self.assertTrue(np.isnan(logits[0]).all())  # the whole row, as the docstring says
    self.assertTrue(np.isfinite(logits[1]).all())

  def test_generate_names_the_cache_protocol(self):

    class MyModel(nnx.Module):

      def __call__(self, tokens):
        return tokens

    with self.assertRaisesRegex(TypeError, r'init_cache\(batch_size, cache_size\).*'
                                r'extend\(tokens.*MyModel has no init_cache or extend'):
      aj.generate(MyModel(), jnp.ones((1, 2), jnp.int32), 3)

  def test_generate_works_on_any_model_with_the_protocol(self):
    lm = _lm()

    class Wrapper(nnx.Module):  # no `positions` keyword, no private methods

      def __init__(self, inner):
        self.inner = inner

      def init_cache(self, batch_size, cache_size):
        return self.inner.init_cache(batch_size, cache_size)

      def extend(self, tokens, cache, start):
        return self.inner.extend(tokens, cache, start)

    prompt = jnp.array([[1, 2, 3]], jnp.int32)
    chex.assert_trees_all_equal(aj.generate(Wrapper(lm), prompt, 4),
                                aj.generate(lm, prompt, 4))

  @parameterized.parameters('rope:coupled', 'rope:randomized')
  def test_encoding_modifier_is_explained(self, spec):
    with self.assertRaisesRegex(ValueError, r'is a modifier of a sweep spec.*build '
                                r"'rope' and pass the positions.*coupled_position_ids"):
      _lm(encoding=spec)


class CoupledPositionIdsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters('copy', 'reverse', 'duplicate')
  def test_library_ids_equal_the_labs(self, name):
    task = lab_tasks.get_task(name)
    lengths, total = jnp.array([1, 3, 4]), task.sequence_length(4)
    offset = jnp.array([1, 2, 5])
    chex.assert_trees_all_equal(
        aj.positional.coupled_position_ids(task.spec.rule, lengths, total, offset,
                                           output_factor=task.spec.output_factor),
        lab_coupling.coupled_positions(task.spec, lengths, total, offset))

  def test_copy_ids_by_hand(self):
    copy = lambda x, n, j: jnp.take_along_axis(x, j, 1)
    # BOS x1 x2 SEP y1 y2 EOS: x at 1, 2; SEP and y1 one before the next source.
    got = aj.positional.coupled_position_ids(copy, jnp.array([2]), 7, 1)
    np.testing.assert_array_equal(got, [[0, 2, 3, 1, 2, 3, 0]])


if __name__ == '__main__':
  absltest.main()
