"""The interface the 2024-25 methods need: what an encoding may read
(`ScoreContext`, `token_features`), the `DifferenceBias` spec every kernel
builds its own way, the normalization column of the kernel table, and one
encoding per layer."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention import Request
from attention_jax.attention import select_implementation
from attention_jax.attention.masks import combine_masks
from attention_jax.attention.masks import structural_mask


class ContentDecay(aj.PositionalEncoding):
  """A user's content-dependent encoding: key j is penalised by the sum of
  softplus(x_t · w_h) over the tokens t after it (a FoX-like decay written
  only with the public hooks)."""

  def __init__(self, d_model, num_heads, rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (d_model, num_heads)))

  @classmethod
  def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
    del max_positions, causal
    return cls(d_model, num_heads, rngs)

  def token_features(self, x):
    return -jax.nn.softplus(x.astype(jnp.float32) @ self.w[...])  # [B, T, H]

  def score_contribution(self, context):
    c = jnp.swapaxes(jnp.cumsum(context.k_features, axis=1), 1, 2)  # [B, H, T_k]
    return aj.DifferenceBias(jnp.take(c, context.q_slots, axis=2), c, origin='content decay')


def _lm(encoding, **kw):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                          encoding=encoding, max_positions=32, rngs=nnx.Rngs(0), **kw)


class ScoreContextTest(chex.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('causal', True, None, None), ('window', True, 3, None),
                                  ('padding', False, None, (7, 4)))
  def test_score_context_visible_is_the_mask_attention_applies(self, causal, window, lengths):
    q = jnp.zeros((2, 7, 2, 4))
    lengths = None if lengths is None else jnp.array(lengths)
    user = jnp.asarray(np.random.default_rng(0).random((1, 1, 7, 7)) > 0.2)
    context = aj.ScoreContext(q=q, k=q, q_positions=np.arange(7), k_positions=np.arange(7),
                              q_slots=np.arange(7), causal=causal, window=window,
                              kv_lengths=lengths, mask=user)
    want = combine_masks(user, structural_mask(7, 7, causal=causal, window=window,
                                               kv_lengths=lengths))
    np.testing.assert_array_equal(*jnp.broadcast_arrays(context.visible(), want))

  def test_difference_bias_errors_name_the_shapes(self):
    with self.assertRaisesRegex(ValueError, r'q_values \[B\|1, H, T_q\] .* got \(2, 3\)'):
      aj.DifferenceBias(jnp.zeros((2, 3)), jnp.zeros((2, 3, 4)))
    q = jnp.zeros((1, 5, 2, 4))
    with self.assertRaisesRegex(ValueError, r'for B=1, H=2, T_q=5, T_k=5'):
      aj.scaled_dot_product_attention(q, q, q, causal=True, score_bias=aj.DifferenceBias(
          jnp.zeros((1, 2, 4)), jnp.zeros((1, 2, 5))))

  def test_kernel_table_says_who_serves_differences_and_stick_breaking(self):
    call = dict(t_k=512, dtype=jnp.float32, head_dim=16)
    pick = lambda **kw: select_implementation('auto', Request(**call, **kw), 'cpu')
    self.assertEqual(pick(difference_bias=True), 'chunked')
    self.assertEqual(pick(normalization='stick_breaking'), 'chunked')
    self.assertEqual(pick(normalization='stick_breaking', return_weights=True), 'dense')
    with self.assertRaisesRegex(ValueError, r"'cudnn' cannot serve.*normalization="
                                r"'stick_breaking' \(it serves softmax\)"):
      select_implementation('cudnn', Request(**call, normalization='stick_breaking'), 'gpu')
    with self.assertRaisesRegex(ValueError, r"normalization='bogus'; choose one of"):
      q = jnp.zeros((1, 4, 1, 4))
      aj.scaled_dot_product_attention(q, q, q, causal=True, normalization='bogus')

  @parameterized.named_parameters(('dense', 'dense'), ('chunked', 'chunked'))
  def test_user_content_encoding_on_every_kernel_and_in_the_cache(self, implementation):
    aj.register_encoding('content_decay', ContentDecay)
    self.addCleanup(aj.ENCODINGS.pop, 'content_decay')
    dense = _lm('content_decay', implementation='dense')
    model = _lm('content_decay', implementation=implementation)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 11)
    want = dense(tokens)
    chex.assert_trees_all_close(model(tokens), want, atol=2e-5)
    cache = model.init_cache(2, 9)
    self.assertEqual(cache[0]['features'].shape, (2, 9, 4))
    pieces = []
    for i in range(9):
      logits, cache = model.extend(tokens[:, i:i + 1], cache, i)
      pieces.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(pieces, 1), want, atol=2e-5)
    self.assertNotIn('features', _lm('rope').init_cache(2, 9)[0])


class PerLayerEncodingTest(parameterized.TestCase):

  def test_per_layer_encodings_are_their_own_modules(self):
    class Owned(aj.PositionalEncoding):
      per_layer = True

      def __init__(self, rngs):
        self.scale = nnx.Param(jax.random.normal(rngs.params(), ()))

      @classmethod
      def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
        return cls(rngs)

      def attention_bias(self, q_positions, k_positions):
        return self.scale[...] * aj.relative_distance(q_positions, k_positions)[None]

    aj.register_encoding('owned', Owned)
    self.addCleanup(aj.ENCODINGS.pop, 'owned')
    encodings = lambda m: [b.attention.positional for b in m.blocks]
    first, second = encodings(_lm('owned'))
    self.assertIsNot(first, second)
    self.assertNotEqual(float(first.scale[...]), float(second.scale[...]))
    shared = encodings(_lm('owned', encoding_per_layer=False))
    self.assertIs(shared[0], shared[1])
    alibi = encodings(_lm('alibi'))
    self.assertIs(alibi[0], alibi[1])
    self.assertIs(_lm('alibi', encoding_per_layer=True).blocks[1].attention.positional.causal,
                  True)


if __name__ == '__main__':
  absltest.main()
