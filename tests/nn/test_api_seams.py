"""Seams of the public API, tested from outside the package (`import
attention_jax as aj` and its public names only): where an encoding's
parameters live and how to reach them, one bias-shape convention, the
stick-breaking function's return, the encoded q and k, CoPE's table size,
an exportable cached step of a learned-position model, stick-breaking's
'head_bias' remainder (the authors' model code) and the layers an encoding
acts in."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj

B, T, H, D = 2, 6, 2, 8


def _x(t=T, seed=1, width=H * D):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((B, t, width)), jnp.float32)


def _lm(encoding='none', num_layers=2, **options):
  return aj.TransformerLM(vocab_size=11, d_model=H * D, num_heads=H, num_layers=num_layers,
                          mlp_dim=32, encoding=encoding, rngs=nnx.Rngs(0), **options)


def _paths(module):
  flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
  return ['/'.join(map(str, path)) for path, _ in flat]


class EncodingAccessorTest(chex.TestCase, parameterized.TestCase):
  """Item 1: `module.encoding`, documented paths `positional.<name>`."""

  @parameterized.parameters(('cope', 'pos_emb'), ('kerple', 'raw_r1'), ('t5', 'table'))
  def test_encoding_accessor_holds_the_parameters(self, name, parameter):
    mha = aj.MultiHeadAttention(H * D, H, causal=True, encoding=name, max_positions=8,
                                rngs=nnx.Rngs(0))
    self.assertIsInstance(mha.encoding, aj.PositionalEncoding)
    self.assertIs(mha.encoding, mha.positional)
    self.assertIn(f'positional/{parameter}', _paths(mha))
    self.assertEqual(type(aj.positional).__name__, 'module')  # the subpackage, untouched

  def test_encoding_accessor_of_models_and_self_attention(self):
    learned = _lm('learned', max_positions=8)
    self.assertIn('positional/table', _paths(learned))
    self.assertIs(learned.encoding, learned.positional)
    kerple = _lm('kerple')
    self.assertIs(kerple.encoding, kerple.blocks[0].attention.encoding)
    self.assertIs(kerple.blocks[1].attention.encoding, kerple.encoding)  # shared
    sa = aj.SelfAttention(16, 8, encoding='alibi', rngs=nnx.Rngs(0))
    self.assertIs(sa.encoding, sa.positional)

  def test_encoding_accessor_leaves_parameter_paths_unchanged(self):
    self.assertEqual(_paths(_lm('fox', num_layers=1)), [
        'blocks/0/attention/W_K/kernel', 'blocks/0/attention/W_O/kernel',
        'blocks/0/attention/W_Q/kernel', 'blocks/0/attention/W_V/kernel',
        'blocks/0/attention/positional/gate_bias', 'blocks/0/attention/positional/gate_kernel',
        'blocks/0/attention_norm/bias', 'blocks/0/attention_norm/scale',
        'blocks/0/mlp_in/bias', 'blocks/0/mlp_in/kernel', 'blocks/0/mlp_norm/bias',
        'blocks/0/mlp_norm/scale', 'blocks/0/mlp_out/bias', 'blocks/0/mlp_out/kernel',
        'embed/embedding', 'final_norm/bias', 'final_norm/scale', 'unembed/bias',
        'unembed/kernel'])


def _bias_cases():
  return [dict(testcase_name=f'{name}_{"causal" if causal else "bidirectional"}', name=name,
               causal=causal) for name in sorted(aj.ENCODINGS) for causal in (True, False)]


class BiasShapeConventionTest(chex.TestCase, parameterized.TestCase):
  """Item 2: pure functions [H, T_q, T_k]; every module method rank 4."""

  @parameterized.named_parameters(_bias_cases())
  def test_attention_bias_is_rank4_for_every_registered_encoding(self, name, causal):
    try:
      enc = aj.make_encoding(name, d_model=H * D, num_heads=H, max_positions=16,
                             causal=causal, rngs=nnx.Rngs(0))
    except ValueError:
      self.skipTest(f'{name} is not built with causal={causal}')
    p, attention_bias = np.arange(5), getattr(enc, 'attention_bias', None)
    bias = None if attention_bias is None else attention_bias(p, np.arange(7))
    if bias is None:
      return  # no positions-only bias (none, rotary, or one that reads q and k)
    chex.assert_shape(bias, (1, H, 5, 7))
    self.assertEqual(bias.dtype, jnp.float32)
    batched = attention_bias(np.stack([p, p + 3]), np.stack([np.arange(7)] * 2))
    chex.assert_shape(batched, (2, H, 5, 7))

  def test_pure_position_functions_are_per_head(self):
    pe, q, k = aj.positional, np.arange(5), np.arange(7)
    qb, kb = np.stack([q, q + 1]), np.stack([k, k])
    slopes, r = pe.alibi_slopes(H), jnp.ones((H,))
    for fn in (lambda q, k: pe.alibi_bias_at(slopes, q, k),
               lambda q, k: pe.kerple_log_bias(r, r, q, k),
               lambda q, k: pe.hard_alibi_bias((1,), H, q, k),
               lambda q, k: pe.learned_window_bias(jnp.ones((1,)), jnp.ones((1,)), H, q, k)):
      chex.assert_shape(fn(q, k), (H, 5, 7))
      chex.assert_shape(fn(qb, kb), (2, H, 5, 7))
    chex.assert_shape(pe.alibi_bias(H, 5, 7), (H, 5, 7))


class StickBreakingReturnTest(chex.TestCase, parameterized.TestCase):
  """Item 3: weights only when asked, with the dense function's keyword."""

  def test_returns_weights_only_when_asked(self):
    q, k, v = (jax.random.normal(jax.random.key(i), (B, T, H, D)) for i in range(3))
    out = aj.stick_breaking_attention(q, k, v)
    chex.assert_shape(out, (B, T, H, D))
    out2, weights = aj.stick_breaking_attention(q, k, v, return_weights=True)
    chex.assert_trees_all_equal(out, out2)
    chex.assert_shape(weights, (B, H, T, T))
    sdpa = aj.scaled_dot_product_attention(q, k, v, causal=True,
                                           normalization='stick_breaking',
                                           implementation='dense', return_weights=True)
    chex.assert_trees_all_close(sdpa, (out, weights), atol=1e-6)


class EncodedQueriesKeysTest(chex.TestCase, parameterized.TestCase):
  """Item 4: `encoded_queries_keys` is what the scores are made of."""

  @parameterized.named_parameters(
      ('rope', dict(encoding='rope')), ('xpos', dict(encoding='xpos')),
      ('alibi', dict(encoding='alibi')), ('scalable_gqa', dict(encoding='rope',
                                                               scalable_softmax=1.5,
                                                               num_kv_heads=1)))
  def test_scores_recomputed_from_them_give_the_weights(self, options):
    mha = aj.MultiHeadAttention(H * D, H, causal=True, implementation='dense',
                                rngs=nnx.Rngs(0), **options)
    x, positions = _x(), np.arange(3, 3 + T)
    q, k = mha.encoded_queries_keys(x, positions=positions)
    chex.assert_shape((q, k), ((B, T, H, D), (B, T, mha.num_kv_heads, D)))
    k = jnp.repeat(k, H // mha.num_kv_heads, axis=2)
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(D)
    bias = getattr(mha.encoding, 'attention_bias', lambda *_: None)(positions, positions)
    scores = scores + (0.0 if bias is None else bias)
    scores = jnp.where(np.tril(np.ones((T, T), bool)), scores, -jnp.inf)
    _, weights = mha(x, positions=positions, return_weights=True)
    chex.assert_trees_all_close(weights, jax.nn.softmax(scores, -1), atol=1e-5)

  def test_cross_attention_shapes(self):
    mha = aj.MultiHeadAttention(H * D, H, causal=False, encoding='rope', rngs=nnx.Rngs(0))
    q, k = mha.encoded_queries_keys(_x(3), _x(9, seed=2))
    chex.assert_shape((q, k), ((B, 3, H, D), (B, 9, H, D)))


class CopeSizeTest(chex.TestCase):
  """Item 5: no silent 64 positions."""

  def test_cope_without_a_size_is_an_error_naming_both_options(self):
    message = r'cope needs the size of its position table: npos .* or max_positions'
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding('cope', d_model=H * D, num_heads=H)
    with self.assertRaisesRegex(ValueError, message):
      aj.MultiHeadAttention(H * D, H, causal=True, encoding='cope', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, message):
      _lm('cope')

  def test_models_that_know_the_length_size_the_table(self):
    model = _lm('cope', max_positions=12)
    for block in model.blocks:
      chex.assert_shape(block.attention.encoding.pos_emb[...], (D, 13))
    chex.assert_shape(model(jnp.zeros((B, T), jnp.int32)), (B, T, 11))
    mha = aj.MultiHeadAttention(H * D, H, causal=True, encoding='cope',
                                encoding_options={'npos': 5}, rngs=nnx.Rngs(0))
    chex.assert_shape(mha.encoding.pos_emb[...], (D, 5))


class LearnedCachedExportTest(chex.TestCase):
  """Item 6: the default learned model's cached step exports; limits still raise."""

  def test_cached_extend_exports_for_tpu_and_cuda(self):
    model = _lm('learned', max_positions=8)
    graphdef, state = nnx.split(model)
    abstract = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
    step = jax.jit(lambda s, tokens, cache, start: nnx.merge(graphdef, s).extend(
        tokens, cache, start))
    exported = jax.export.export(step, platforms=('tpu', 'cuda'))(
        abstract(state), jax.ShapeDtypeStruct((B, 1), jnp.int32),
        abstract(model.init_cache(B, 8)), jax.ShapeDtypeStruct((), jnp.int32))
    self.assertEqual(exported.platforms, ('tpu', 'cuda'))
    self.assertNotIn('callback', exported.mlir_module())

  def test_cached_logits_equal_the_full_pass(self):
    model = _lm('learned', max_positions=8)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (B, T)), jnp.int32)
    cache = model.init_cache(B, 8)
    step = nnx.jit(lambda m, t, c, s: m.extend(t, c, s))
    first, cache = step(model, tokens[:, :4], cache, jnp.int32(0))
    second, cache = step(model, tokens[:, 4:], cache, jnp.int32(4))
    chex.assert_trees_all_close(jnp.concatenate([first, second], 1), model(tokens),
                                atol=1e-5)

  def test_too_long_cache_or_positions_raise_clear_errors(self):
    model = _lm('learned', max_positions=8)
    cache = model.init_cache(B, 9)  # one slot past the table
    message = (r'a cache of 9 slots .* up to position 8: positions range over \[0, 8\] but '
               r'the learned table has max_positions=8 rows')
    with self.assertRaisesRegex(ValueError, message):
      model.extend(jnp.zeros((B, 1), jnp.int32), cache, 0)
    with self.assertRaisesRegex(ValueError, message):  # at trace time, before any run
      nnx.jit(lambda m, c, s: m.extend(jnp.zeros((B, 1), jnp.int32), c, s))(
          model, cache, jnp.int32(0))
    with self.assertRaisesRegex(ValueError, r'positions range over \[0, 9\]'):
      model(jnp.zeros((B, 10), jnp.int32))
    with self.assertRaisesRegex(ValueError, r'positions range over \[20, 20\]'):
      model.extend(jnp.zeros((B, 1), jnp.int32), model.init_cache(B, 4), 0,
                   positions=np.array([20]))


def _official_sb_attention(x, w_q, w_k, w_v, w_o, head_bias, gn_weight, gn_bias):
  """NumPy transcription of IBM/dolomite-engine's `SBAttention.forward`
  (lm_engine/hf_models/modeling_utils/sequence_mixer_blocks/
  stickbreaking_attention.py, commit d0ee1861), with `sb_attn` as its
  reference math (shawntan/stickbreaking-attention sb_ref.py, attend_current
  False), float64; the projections are ours, [B, T, H, D] -> [B, H, T, D]."""
  heads = lambda w: np.einsum('btm,mhd->bhtd', x, w)
  q, k, v = heads(w_q), heads(w_k), heads(w_v)
  t, d = q.shape[2], q.shape[3]
  logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
  mask = np.triu(np.ones((t, t)), 0).astype(bool)  # masked out: j >= i
  log_sigmoid = lambda z: -np.logaddexp(0.0, -z)
  log_z = np.where(mask, -1e5, log_sigmoid(logits))
  log_beta = np.where(mask, 0.0, log_sigmoid(-logits))
  att = np.exp(log_z + np.einsum('bhij,jk->bhik', log_beta, np.tril(np.ones((t, t)), -1)))
  hidden, rem = att @ v, 1 - att.sum(-1)
  hidden = hidden + rem[..., None] * head_bias[None, :, None, :]
  b, h = hidden.shape[:2]
  hidden = np.transpose(hidden, (0, 2, 1, 3)).reshape(b * t, h, d)  # torch GroupNorm(H, H·D)
  mean, var = hidden.mean(-1, keepdims=True), hidden.var(-1, keepdims=True)
  hidden = ((hidden - mean) / np.sqrt(var + 1e-5)).reshape(b * t, h * d) * gn_weight + gn_bias
  return np.einsum('bthd,hdm->btm', hidden.reshape(b, t, h, d), w_o)


class StickBreakingHeadBiasTest(chex.TestCase, parameterized.TestCase):
  """Item 7: `StickBreaking(remainder='head_bias')`, the authors' model code."""

  def _mha(self, implementation='dense'):
    mha = aj.MultiHeadAttention(
        H * D, H, causal=True, normalization=aj.StickBreaking(remainder='head_bias'),
        implementation=implementation, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(7)  # away from the zero / identity start
    for param in (mha.remainder.head_bias, mha.remainder.norm.scale, mha.remainder.norm.bias):
      param[...] = jnp.asarray(rng.standard_normal(param.shape), jnp.float32)
    return mha

  @parameterized.parameters('dense', 'chunked')
  def test_equals_numpy_transcription_of_sbattention(self, implementation):
    mha, x = self._mha(implementation), _x(9)
    arrays = [np.asarray(a, np.float64) for a in (
        mha.W_Q.kernel[...], mha.W_K.kernel[...], mha.W_V.kernel[...], mha.W_O.kernel[...],
        mha.remainder.head_bias[...], mha.remainder.norm.scale[...],
        mha.remainder.norm.bias[...])]
    want = _official_sb_attention(np.asarray(x, np.float64), *arrays)
    np.testing.assert_allclose(np.asarray(mha(x)), want, atol=2e-5)

  def test_starts_at_zero_and_the_default_is_unchanged(self):
    mha = aj.MultiHeadAttention(H * D, H, causal=True,
                                normalization=aj.StickBreaking(remainder='head_bias'),
                                rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(mha.remainder.head_bias[...], 0.0)
    self.assertEqual(aj.StickBreaking().remainder, 'value')
    plain = aj.MultiHeadAttention(H * D, H, causal=True, normalization='stick_breaking',
                                  rngs=nnx.Rngs(0))
    self.assertFalse([p for p in _paths(plain) if p.startswith('remainder')])
    with self.assertRaisesRegex(ValueError, r"StickBreaking\(remainder='rest'\): choose one "
                                r"of \('value', 'head_bias'\)"):
      aj.StickBreaking(remainder='rest')

  def test_cached_decoding_equals_the_full_pass(self):
    mha, x = self._mha(), _x(7)
    cache = mha.init_cache(B, 7)
    first, cache = mha.extend(x[:, :3], cache, 0)
    steps = [first]
    for i in range(3, 7):
      out, cache = mha.extend(x[:, i:i + 1], cache, i)
      steps.append(out)
    chex.assert_trees_all_close(jnp.concatenate(steps, 1), mha(x), atol=1e-5)

  @pytest.mark.slow
  def test_a_transformer_lm_trains_with_it(self):
    model = _lm(normalization=aj.StickBreaking(remainder='head_bias'))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 11, (B, 8)), jnp.int32)

    def loss(m):
      logits = m(tokens[:, :-1])
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    before, grads = nnx.value_and_grad(loss)(model)
    self.assertGreater(float(jnp.abs(grads.blocks[0].attention.remainder.head_bias[...]).sum()),
                       0.0)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, params,
                                   nnx.state(grads, nnx.Param)))
    self.assertLess(float(loss(model)), float(before))


class EncodingLayersTest(chex.TestCase, parameterized.TestCase):
  """Item 8: `TransformerLM(encoding_layers=...)`, default every layer."""

  def test_official_mta_layers(self):
    model = _lm('mta', num_layers=20, encoding_layers=(2, 6, 10, 14, 18))
    with_mta = [i for i, b in enumerate(model.blocks)
                if isinstance(b.attention.encoding, aj.ENCODINGS['mta'])]
    self.assertEqual(with_mta, [2, 6, 10, 14, 18])
    self.assertEqual(model.encoding_layers, (2, 6, 10, 14, 18))
    self.assertIs(model.encoding, model.blocks[2].attention.encoding)
    self.assertEqual(sorted({p.split('/')[1] for p in _paths(model) if 'positional' in p}),
                     ['10', '14', '18', '2', '6'])
    for i in (0, 1, 19):
      self.assertIsInstance(model.blocks[i].attention.encoding, aj.ENCODINGS['none'])

  def test_default_is_every_layer_and_listing_all_is_the_same_model(self):
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 11, (B, T)), jnp.int32)
    default, listed = _lm('mta', num_layers=3), _lm('mta', num_layers=3,
                                                    encoding_layers=(2, 0, 1))
    self.assertEqual(default.encoding_layers, (0, 1, 2))
    chex.assert_trees_all_equal(nnx.state(default, nnx.Param), nnx.state(listed, nnx.Param))
    chex.assert_trees_all_equal(default(tokens), listed(tokens))
    some = _lm('rope', num_layers=3, encoding_layers=(1,))
    chex.assert_shape(some(tokens), (B, T, 11))

  @parameterized.named_parameters(
      ('out_of_range', 'mta', (0, 3)), ('duplicate', 'mta', (1, 1)), ('empty', 'mta', ()),
      ('bool', 'mta', (True,)), ('not_a_sequence', 'mta', 2))
  def test_bad_layers_name_the_value(self, encoding, layers):
    with self.assertRaisesRegex(ValueError, r'encoding_layers=.* must be distinct layer '
                                r'indices in 0 … 2 \(num_layers=3\)'):
      _lm(encoding, num_layers=3, encoding_layers=layers)

  def test_an_embedding_encoding_takes_no_layers(self):
    with self.assertRaisesRegex(ValueError, r"encoding='learned' does not act inside "
                                r'attention'):
      _lm('learned', max_positions=8, encoding_layers=(0,))


if __name__ == '__main__':
  absltest.main()
