"""Hard-ALiBi's windows at an offset (`hard_alibi` `offsets`): a head that
reads exactly the tokens d back, causal where its window is empty."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj


def _lm(encoding, **options):
  return aj.TransformerLM(vocab_size=11, d_model=16, num_heads=4, num_layers=2, mlp_dim=32,
                          encoding=encoding, max_positions=64, encoding_options=options,
                          rngs=nnx.Rngs(0))


class WindowOffsetsTest(chex.TestCase, parameterized.TestCase):

  def test_offset_windows_read_exactly_the_tokens_that_far_back(self):
    enc = aj.make_encoding('hard_alibi', d_model=24, num_heads=3, widths=(1, 2),
                           offsets=(2, 1))
    got = np.asarray(enc.attention_bias(np.arange(7), np.arange(7)))[0]  # [1, H, T, T]
    d = np.arange(7)[:, None] - np.arange(7)[None, :]
    np.testing.assert_array_equal(got[0] == 0, d == 2)  # exactly the token 2 back
    np.testing.assert_array_equal(got[1] == 0, (d >= 1) & (d <= 2))
    np.testing.assert_array_equal(got[2], 0.0)  # the free head
    q = jnp.zeros((1, 7, 3, 8))
    spec = enc.score_contribution(aj.ScoreContext(q=q, k=q, q_positions=None, k_positions=None))
    chex.assert_trees_all_equal(spec.dense(7, 7), jnp.asarray(got)[None])

  def test_an_offset_head_stays_causal_where_its_window_is_empty(self):
    # Queries 0 and 1 of a head reading 2 back have no key in the window: the
    # dense kernel then averages the keys the causal mask allows, never later ones.
    model = _lm('hard_alibi', widths=(1, 1), offsets=(2, 2))
    x = jax.random.randint(jax.random.key(0), (1, 6), 0, 11)
    y = x.at[0, 3:].set((x[0, 3:] + 1) % 11)
    chex.assert_trees_all_close(model(x)[:, :3], model(y)[:, :3], atol=1e-6)

  @parameterized.parameters(
      (dict(offsets=(1,)), r'offsets=\(1,\) has 1 entries but there are 2 windowed heads'),
      (dict(offsets=(1, -1)), r'offsets=\(1, -1\) must be integers >= 0; got -1'),
  )
  def test_bad_offsets_are_clear_errors(self, options, message):
    with self.assertRaisesRegex(ValueError, message):
      aj.make_encoding('hard_alibi', d_model=16, num_heads=4, widths=(1, 2), **options)

  def test_offsets_need_causal_attention(self):
    with self.assertRaisesRegex(ValueError, r'offsets=\(1, 0\) need causal attention'):
      aj.positional.HardALiBi(4, (1, 2), causal=False, offsets=(1, 0))


if __name__ == '__main__':
  absltest.main()
