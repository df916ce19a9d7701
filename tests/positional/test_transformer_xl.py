"""'relative' (Transformer-XL) against a NumPy transcription of DeepMind's
`compute_attention_with_relative_encodings` (randomized_positional_encodings
@ e8c6474), bidirectional and causal, float32 and bfloat16, and with
sampled distances."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from attention_jax.nn.attention import MultiHeadAttention
from attention_jax.positional import make_encoding
from attention_jax.positional.base import ScoreContext


def their_sinusoid(length, hidden, add_negative_side):
  """`sinusoid_position_encoding`: sines, then cosines."""
  freqs = np.arange(0, hidden, 2)
  inv_freq = 10000.0 ** (-freqs / hidden)
  pos = np.arange(-length if add_negative_side else 0, length)
  angles = np.einsum('i,j->ij', pos, inv_freq)
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def interleave(table):
  """Their layout (sines then cosines) -> ours (sin, cos per frequency)."""
  half = table.shape[-1] // 2
  return np.stack([table[..., :half], table[..., half:]], axis=-1).reshape(table.shape)


def their_rel_shift(logits, attention_length, causal):
  tq, total = logits.shape
  if causal:
    x = np.concatenate([np.zeros_like(logits[:, :1]), logits], axis=-1)
    return x.reshape(total + 1, tq)[1:].reshape(tq, total)
  return logits.reshape(total, tq)[1:].reshape(tq, total - 1)[:, :attention_length]


def their_logits(q, k, u, v, kernel, causal):
  """Their attention logits (before 1/√D), q and k `[B, T, H, D]`."""
  b, t, h, d = k.shape
  content = np.einsum('bthd,bThd->bhtT', q + u, k)
  table = interleave(their_sinusoid(t, h * d, add_negative_side=not causal))
  rel_keys = (table @ kernel).reshape(table.shape[0], h, d)
  rel = np.einsum('bthd,Thd->bhtT', q + v, rel_keys)
  shifted = np.stack([np.stack([their_rel_shift(rel[i, j], t, causal) for j in range(h)])
                      for i in range(b)])
  return content + shifted


class TransformerXLTest(chex.TestCase, parameterized.TestCase):

  def test_scores_equal_theirs(self):
    # Bidirectional, the protocol's. (Their causal path indexes a table without
    # the negative side; the causal module here uses the same R(j - i), masked.)
    causal = False
    b, t, h, d = 2, 6, 2, 4
    enc = make_encoding('relative', d_model=h * d, num_heads=h, causal=causal,
                        rngs=nnx.Rngs(0))
    q = jax.random.normal(jax.random.key(1), (b, t, h, d))
    k = jax.random.normal(jax.random.key(2), (b, t, h, d))
    bias = enc.score_contribution(ScoreContext(q=q, k=k, q_positions=np.arange(t),
                                               k_positions=np.arange(t), causal=causal)).bias
    ours = np.einsum('bthd,bThd->bhtT', q, k) + np.sqrt(d) * np.asarray(bias)
    theirs = their_logits(np.asarray(q, np.float64), np.asarray(k, np.float64),
                          np.asarray(enc.u[...]), np.asarray(enc.v[...]),
                          np.asarray(enc.W_r.kernel[...], np.float64), causal)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4)

  def test_causal_scores_are_the_bidirectional_ones_below_the_diagonal(self):
    h, d, t = 2, 4, 6
    both = [make_encoding('relative', d_model=h * d, num_heads=h, causal=c, rngs=nnx.Rngs(0))
            for c in (False, True)]
    q = jax.random.normal(jax.random.key(1), (1, t, h, d))
    k = jax.random.normal(jax.random.key(2), (1, t, h, d))
    bias = [e.score_contribution(ScoreContext(q=q, k=k, q_positions=np.arange(t),
                                              k_positions=np.arange(t), causal=c)).bias
            for e, c in zip(both, (False, True))]
    keep = np.tril(np.ones((t, t), bool))
    chex.assert_trees_all_close(bias[0][..., keep], bias[1][..., keep])

  def test_distances_replace_positions(self):
    h, d, t = 2, 4, 5
    enc = make_encoding('relative', d_model=h * d, num_heads=h, causal=False,
                        rngs=nnx.Rngs(0))
    q = jax.random.normal(jax.random.key(1), (1, t, h, d))
    k = jax.random.normal(jax.random.key(2), (1, t, h, d))
    positions = np.array([0, 3, 4, 9, 20])
    by_positions = enc.score_contribution(ScoreContext(q=q, k=k, q_positions=positions,
                                                       k_positions=positions)).bias
    distances = positions[:, None] - positions[None, :]
    by_distances = enc.score_contribution(ScoreContext(
        q=q, k=k, q_positions=np.arange(t), k_positions=np.arange(t),
        distances=distances)).bias
    chex.assert_trees_all_close(by_positions, by_distances, atol=1e-6)

  @parameterized.parameters(jnp.float32, jnp.bfloat16)
  def test_in_attention_every_dtype(self, dtype):
    attention = MultiHeadAttention(16, 4, causal=False, encoding='relative', dtype=dtype,
                                   rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(3), (2, 7, 16)).astype(dtype)
    out = attention(x, kv_lengths=jnp.array([7, 4]))
    self.assertEqual(out.dtype, dtype)
    self.assertTrue(bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))))
    # Padding past kv_lengths changes nothing for the real tokens.
    short = attention(x[1:, :4])
    chex.assert_trees_all_close(out[1, :4].astype(jnp.float32), short[0].astype(jnp.float32),
                                atol=2e-2 if dtype == jnp.bfloat16 else 1e-5)

  def test_distances_refused_by_an_encoding_that_ignores_them(self):
    attention = MultiHeadAttention(8, 2, causal=False, encoding='rope', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'distances= is read .* not RoPE'):
      attention(jnp.zeros((1, 3, 8)), distances=jnp.zeros((3, 3), jnp.int32))


if __name__ == '__main__':
  absltest.main()
