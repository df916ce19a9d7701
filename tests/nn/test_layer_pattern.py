"""Per-layer patterns of encodings and windows (`nn.layer_pattern`): the
hybrid of RoPE in sliding windows and global NoPE layers as one argument."""

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.nn.layers import Block
from attention_jax.nn.transformer import TransformerLM

B, T, V, D, H, MLP = 2, 12, 11, 16, 2, 32
RNOPE_SWA = 'rope/3,rope/3,rope/3,none'


def _lm(encoding='rope', num_layers=4, **kwargs):
  return TransformerLM(vocab_size=V, d_model=D, num_heads=H, num_layers=num_layers,
                       mlp_dim=MLP, encoding=encoding, max_positions=T, rngs=nnx.Rngs(0),
                       **kwargs)


def _tokens(seed=1):
  return jnp.asarray(np.random.default_rng(seed).integers(0, V, (B, T)), jnp.int32)


def _by_hand(model, layers, tokens):
  """The model's logits with each block rebuilt by hand from `layers`, a
  list of (encoding name or None, window), its parameters copied."""
  x = model.embed(tokens)
  positions = np.arange(tokens.shape[1], dtype=np.int32)
  for block, (name, window) in zip(model.blocks, layers, strict=True):
    encoding = None if name is None else aj.make_encoding(
        name, d_model=D, num_heads=H, max_positions=T, causal=True, rngs=nnx.Rngs(5))
    hand = Block(D, H, MLP, encoding, rngs=nnx.Rngs(7), sliding_window=window)
    nnx.update(hand, nnx.state(block, nnx.Param))
    x, _ = hand(x, positions=positions, return_weights=False)
  return model.unembed(model.final_norm(x))


class LayerPatternTest(chex.TestCase, parameterized.TestCase):

  def test_rnope_swa_pattern_builds_each_layers_encoding_and_window(self):
    model = _lm(num_layers=8, encoding_layers=RNOPE_SWA)
    expected = [('rope', 3), ('rope', 3), ('rope', 3), (None, None)] * 2
    self.assertEqual([tuple(s) for s in model.layer_specs], expected)
    self.assertEqual(model.encoding_layers, (0, 1, 2, 4, 5, 6))
    for block, (name, window) in zip(model.blocks, expected):
      self.assertEqual(block.attention.sliding_window, window)
      self.assertIsInstance(block.attention.encoding, aj.ENCODINGS[name or 'none'])
    # RoPE has no per-layer parameters: one module, shared, the model's.
    self.assertIs(model.blocks[5].attention.encoding, model.encoding)

  def test_a_pattern_repeats_and_is_cut_after_the_last_layer(self):
    model = _lm(num_layers=6, encoding_layers=RNOPE_SWA)
    self.assertEqual(model.encoding_layers, (0, 1, 2, 4, 5))
    self.assertEqual(model.layer_specs[3], (None, None))

  def test_pattern_equals_the_hand_built_model(self):
    model, tokens = _lm(encoding_layers='rope/3,none'), _tokens()
    layers = [('rope', 3), (None, None)] * 2
    chex.assert_trees_all_close(model(tokens), _by_hand(model, layers, tokens),
                                atol=1e-5, rtol=1e-5)
    # The windows matter: the same parameters without them give other logits.
    unwindowed = _by_hand(model, [('rope', None), (None, None)] * 2, tokens)
    self.assertGreater(float(jnp.abs(model(tokens) - unwindowed).max()), 1e-3)

  def test_model_window_and_a_second_encoding(self):
    model = _lm('alibi', encoding_layers='alibi,fire/4', sliding_window=6)
    self.assertEqual([tuple(s) for s in model.layer_specs],
                     [('alibi', 6), ('fire', 4), ('alibi', 6), ('fire', 4)])
    fire = [b.attention.encoding for b in model.blocks[1::2]]
    self.assertIsNot(fire[0], fire[1])  # FIRE's class is per_layer: a table each
    tokens = _tokens(2)
    layers = [('alibi', 6), ('fire', 4)] * 2
    hand = _by_hand(model, layers, tokens)
    chex.assert_trees_all_close(model(tokens), hand, atol=1e-5, rtol=1e-5)

  def test_cached_decoding_equals_the_full_pass(self):
    model, tokens = _lm(num_layers=2, encoding_layers='rope/3,none'), _tokens(3)
    extend = nnx.jit(lambda m, x, c, start: m.extend(x, c, start))  # one compile per shape
    cache = model.init_cache(B, T)
    logits, cache = extend(model, tokens[:, :T - 3], cache, jnp.int32(0))
    steps = [logits]
    for t in range(T - 3, T):  # past the window: the windowed layer drops the oldest keys
      step, cache = extend(model, tokens[:, t:t + 1], cache, jnp.int32(t))
      steps.append(step)
    chex.assert_trees_all_close(jnp.concatenate(steps, 1), model(tokens), atol=1e-4, rtol=1e-4)

  def test_indices_are_a_pattern_of_the_model_encoding(self):
    by_index = _lm(encoding_layers=(0, 2), sliding_window=3)
    by_pattern = _lm(encoding_layers='rope,none', sliding_window=3)
    self.assertEqual(by_index.layer_specs, by_pattern.layer_specs)
    chex.assert_trees_all_equal(by_index(_tokens()), by_pattern(_tokens()))

  @parameterized.named_parameters(
      ('unknown_name', 'rope/3,nope', "'nope' is not an encoding"),
      ('absolute_encoding', 'rope,learned', "'learned' adds to the embeddings once"),
      ('zero_window', 'rope/0,none', r"window in 'rope/0' must be an integer >= 1"),
      ('word_window', 'rope/w,none', r"window in 'rope/w' must be an integer >= 1"),
      ('empty_spec', 'rope,,none', 'an empty spec is not one'),
      ('empty', '', 'an empty spec is not one'),
      ('longer_than_the_model', 'rope,rope,rope,rope,none',
       r'has 5 specs, more than num_layers=4'),
      ('other_encoding', 'alibi/3,none', r"the model's encoding is its first encoded layer's, "
                                         r"'alibi'; pass encoding='alibi'"),
  )
  def test_bad_patterns_are_refused_naming_the_value(self, pattern, message):
    with self.assertRaisesRegex(ValueError, r'encoding_layers=.*' + message):
      _lm(encoding_layers=pattern)

  def test_an_all_nope_pattern_needs_encoding_none(self):
    self.assertEqual(_lm('none', encoding_layers='none/2').encoding_layers, ())
    with self.assertRaisesRegex(ValueError, r"has no encoded layer, so the model's encoding is "
                                r"'none', not encoding='rope'"):
      _lm(encoding_layers='none/2')


if __name__ == '__main__':
  absltest.main()
