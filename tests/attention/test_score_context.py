"""The interface the 2024-25 methods need: what an encoding may read
(`ScoreContext`, `token_features`), the `DifferenceBias` spec every kernel
builds its own way, the normalization column of the kernel table, and one
encoding per layer."""

import dataclasses
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.attention import KERNELS
from attention_jax.attention import Kernel
from attention_jax.attention import Request
from attention_jax.attention import register_kernel
from attention_jax.attention import select_implementation
from attention_jax.attention.dense import dense_kernel
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
    c = jnp.cumsum(context.k_features, axis=1)  # [B, T_k, H]
    return aj.DifferenceBias(jnp.take(c, context.q_slots, axis=1), c, origin='content decay')


@dataclasses.dataclass(frozen=True, eq=False)
class KeyBonus(aj.ScoreSpec):
  """A user's own kind of score spec, defined outside the package: adds
  bonus[b, j, h] to every query's score of key j; bonus `[B|1, T_k, H]`."""
  kind = 'a key bonus'
  bonus: jnp.ndarray
  origin: Optional[str] = None

  def check(self, b, h, t_q, t_k):
    if jnp.shape(self.bonus)[1:] != (t_k, h) or jnp.shape(self.bonus)[0] not in (1, b):
      raise ValueError(f'KeyBonus {jnp.shape(self.bonus)} for B={b}, T_k={t_k}, H={h}.')

  def dense(self, t_q, t_k):
    return jnp.moveaxis(jnp.asarray(self.bonus, jnp.float32), -1, 1)[:, :, None, :]


def key_bonus_kernel(q, k, v, *, scores, **options):
  """A user's kernel that takes KeyBonus (here: as the dense kernel would)."""
  (bonus,) = scores  # the spec itself, whole
  assert isinstance(bonus, KeyBonus)
  return dense_kernel(q, k, v, scores=(aj.DenseBias(bonus.dense(q.shape[1], k.shape[1])),),
                      **options)


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
    with self.assertRaisesRegex(ValueError, r'q_values \[B\|1, T_q, H\] .* got \(2, 3\)'):
      aj.DifferenceBias(jnp.zeros((2, 3)), jnp.zeros((2, 3, 4)))
    q = jnp.zeros((1, 5, 2, 4))
    with self.assertRaisesRegex(ValueError, r'for B=1, H=2, T_q=5, T_k=5: need \[B\|1, T_q, H\]'):
      aj.scaled_dot_product_attention(q, q, q, causal=True, score_bias=aj.DifferenceBias(
          jnp.zeros((1, 4, 2)), jnp.zeros((1, 5, 2))))

  def test_kernel_table_says_who_serves_differences_and_stick_breaking(self):
    call = dict(t_k=512, dtype=jnp.float32, head_dim=16)
    pick = lambda **kw: select_implementation('auto', Request(**call, **kw), 'cpu')
    self.assertEqual(pick(scores=(aj.DifferenceBias,)), 'chunked')
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


class NewSpecKindTest(chex.TestCase):
  """A new kind of score spec touches its class and the kernels that take
  it: here both live in this test file, nothing in the package changes."""

  def setUp(self):
    super().setUp()
    self.q = jax.random.normal(jax.random.key(0), (2, 6, 2, 8))
    self.spec = KeyBonus(jax.random.normal(jax.random.key(1), (2, 6, 2)), origin='a test')
    self.want = aj.scaled_dot_product_attention(
        self.q, self.q, self.q, causal=True, implementation='dense',
        bias=jnp.moveaxis(self.spec.bonus, -1, 1)[:, :, None, :])

  def test_the_materialising_kernels_take_it_through_its_dense_form(self):
    got = aj.scaled_dot_product_attention(self.q, self.q, self.q, causal=True,
                                          score_bias=self.spec)  # 'auto': dense on CPU
    chex.assert_trees_all_close(got, self.want, atol=1e-6)
    with self.assertRaisesRegex(ValueError, r"'chunked' cannot serve this call: a key bonus "
                                r"from a test \[KeyBonus: 'cudnn', 'tpu_flash', 'dense' take "
                                r"it\]"):
      aj.scaled_dot_product_attention(self.q, self.q, self.q, causal=True,
                                      score_bias=self.spec, implementation='chunked')
    with self.assertRaisesRegex(ValueError, r'KeyBonus \(2, 6, 2\) for B=2, T_k=5'):
      aj.scaled_dot_product_attention(self.q, self.q[:, :5], self.q[:, :5],
                                      score_bias=self.spec)

  def test_a_kernel_registered_from_outside_declares_it_and_auto_prefers_it(self):
    register_kernel('key_bonus', Kernel(key_bonus_kernel, weights=False, dense_mask=False,
                                        accepts=frozenset({KeyBonus})))
    self.addCleanup(KERNELS.pop, 'key_bonus')
    call = dict(t_k=6, dtype=jnp.float32, head_dim=8, causal=True)
    self.assertEqual(select_implementation('auto', Request(**call, scores=(KeyBonus,)), 'cpu'),
                     'key_bonus')  # a compact kind: before the rows that materialise it
    self.assertEqual(select_implementation('auto', Request(**call), 'cpu'), 'dense')
    with self.assertRaisesRegex(ValueError, r"'key_bonus' cannot serve this call: a linear "
                                r"bias \(ALiBi slopes\) \[LinearBias: 'cudnn', .*'chunked', "
                                r"'tpu_flash', 'dense' take it\]"):
      select_implementation('key_bonus', Request(**call, scores=(aj.LinearBias,)), 'cpu')
    with self.assertRaisesRegex(ValueError, 'more than one KeyBonus'):
      select_implementation('key_bonus', Request(**call, scores=(self.spec, self.spec)), 'cpu')
    got = aj.scaled_dot_product_attention(self.q, self.q, self.q, causal=True,
                                          score_bias=self.spec, implementation='key_bonus')
    chex.assert_trees_all_close(got, self.want, atol=1e-6)
    with self.assertRaisesRegex(ValueError, "register_kernel: name='dense' must be a new"):
      register_kernel('dense', KERNELS['dense'])

  def test_a_kind_without_a_dense_form_is_refused_naming_who_takes_it(self):
    @dataclasses.dataclass(frozen=True)
    class Opaque(aj.ScoreSpec):
      kind = 'an opaque spec'

    with self.assertRaisesRegex(ValueError, r"'dense' cannot serve this call: an opaque spec "
                                r'\[Opaque: no kernel takes it'):
      aj.scaled_dot_product_attention(self.q, self.q, self.q, score_bias=Opaque(),
                                      implementation='dense')

  def test_a_score_spec_tuple_adds_up(self):
    lin = aj.LinearBias((0.5, 0.25))
    got = aj.scaled_dot_product_attention(self.q, self.q, self.q, causal=True,
                                          score_bias=(lin, self.spec), implementation='dense')
    want = aj.scaled_dot_product_attention(
        self.q, self.q, self.q, causal=True, implementation='dense',
        bias=lin.dense(6, 6) + self.spec.dense(6, 6))
    chex.assert_trees_all_close(got, want, atol=1e-6)
    with self.assertRaisesRegex(TypeError, 'score_bias must be a ScoreSpec .* got ndarray'):
      aj.scaled_dot_product_attention(self.q, self.q, self.q, score_bias=np.zeros(3))

  def test_the_old_hooks_are_refused_where_they_are_defined(self):
    with self.assertRaisesRegex(TypeError, 'Stale defines attention_bias, which attention does '
                                'not call: the one score hook is score_contribution'):
      class Stale(aj.PositionalEncoding):  # pylint: disable=unused-variable
        def attention_bias(self, q_positions, k_positions):
          return None


class PerLayerEncodingTest(parameterized.TestCase):

  def test_per_layer_encodings_are_their_own_modules(self):
    class Owned(aj.PositionalEncoding):
      per_layer = True

      def __init__(self, rngs):
        self.scale = nnx.Param(jax.random.normal(rngs.params(), ()))

      @classmethod
      def build(cls, *, d_model, num_heads, max_positions, causal, rngs):
        return cls(rngs)

      def score_contribution(self, context):
        distance = aj.relative_distance(context.q_positions, context.k_positions)
        return aj.DenseBias(self.scale[...] * distance[None, None].astype(jnp.float32))

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
