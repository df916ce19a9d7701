"""The encoder protocol against DeepMind's code: the layout, the randomized
positions and distances, ALiBi's bidirectional bias, the loss, accuracy and
scores (google-deepmind/randomized_positional_encodings @ e8c6474,
transcribed in NumPy / their JAX calls below)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.protocols import encoder
from attention_jax.lab.tasks.spec import TaskSpec
from attention_jax.lab.tasks.spec import same_length
from attention_jax.nn.encoder import TransformerEncoder
from attention_jax.positional.alibi import ALiBi
from attention_jax.positional.alibi import alibi_slopes


def _bits(key, n, b, big):
  x = jax.random.randint(key, (b, big), 0, 2)
  return jnp.where(jnp.arange(big)[None] < n, x, 0)


def _parity(key, n, b, big):
  x = _bits(key, n, b, big)
  return x, jnp.sum(x, 1, keepdims=True) % 2


def _terminated(key, n, b, big):
  """y = x then the terminator 2, zeros after (output length n + 1)."""
  x = _bits(key, n, b, big)
  j = jnp.arange(big + 1)[None]
  return x, jnp.where(j < n, jnp.pad(x, ((0, 0), (0, 1))), jnp.where(j == n, 2, 0))


PARITY = TaskSpec('parity', 'regular', 2, 2, _parity)
TERMINATED = TaskSpec('term', 'context_free', 2, 3, _terminated,
                      output_length=lambda n: n + 1, terminated=True)


# --- Their code, transcribed -------------------------------------------------

def their_rel_shift_inner(logits, attention_length):
  """`_rel_shift_inner`, NumPy."""
  tq, total = logits.shape
  assert total == tq + attention_length
  logits = logits.reshape(total, tq)[1:].reshape(tq, total - 1)
  return logits[:, :attention_length]


def their_noisy_alibi(key, num_heads, t, noise_max_length):
  """`compute_noisy_alibi_encodings_biases(randomize_both_sides=False)` with
  the key their `hk.next_rng_key()` would give."""
  symmetric = jax.random.choice(key, jnp.arange(1, noise_max_length), shape=(t - 1,),
                                replace=False)
  symmetric = -np.sort(np.asarray(symmetric)).astype(np.float64)
  right = symmetric[:t - 1]
  left = np.flip(symmetric)[:t - 1] + 0.5
  left = np.concatenate([[0.0], left])  # their dummy (jnp.empty) entry, ignored
  positions = np.concatenate([left, [0.0], right])
  alibi = their_rel_shift_inner(np.tile(positions, (t, 1)), t)
  return alibi[None] * np.asarray(alibi_slopes(num_heads), np.float64)[:, None, None]


def their_alibi(num_heads, t):
  """`compute_alibi_encodings_biases`, NumPy."""
  alibi = np.zeros((t, t))
  alibi -= sum(np.tri(t, t, k=-i) for i in range(1, t))
  alibi -= sum(np.tri(t, t, k=-i).T for i in range(1, t))
  alibi += 0.5 * np.tri(t, t, k=-1)
  return alibi[None] * np.asarray(alibi_slopes(num_heads), np.float64)[:, None, None]


def their_noisy_indexes(key, noise_max_length, t):
  """`noisy_fixed_positional_encodings`' indexes."""
  return np.sort(np.asarray(jax.random.choice(key, jnp.arange(noise_max_length), shape=(t,),
                                              replace=False)))


class LayoutTest(chex.TestCase):

  def test_encoder_batch_blanks_targets_and_masks(self):
    b = encoder_layout.encoder_batch(TERMINATED, jax.random.key(0), jnp.int32(3), batch_size=4,
                             max_length=5)
    x, y = _terminated(jax.random.key(0), 3, 4, 5)
    # 5 input slots + 6 output slots; n = 3: x x x BLANK×4 PAD×4 (BLANK = PAD = 2).
    np.testing.assert_array_equal(b['tokens'][:, :3], x[:, :3])
    np.testing.assert_array_equal(b['tokens'][:, 3:], 2)
    np.testing.assert_array_equal(b['lengths'], 7)
    np.testing.assert_array_equal(b['targets'][:, 3:7], y[:, :4])
    np.testing.assert_array_equal(b['output_mask'][0], [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    # The terminator sits at output 3 (the last): every output counts.
    np.testing.assert_array_equal(b['accuracy_mask'], b['output_mask'])

  def test_accuracy_mask_stops_at_the_first_terminator(self):
    def early(key, n, b, big):  # terminator after 1 symbol, zeros after it
      j = jnp.arange(big + 1)[None]
      return _bits(key, n, b, big), jnp.broadcast_to(jnp.where(j == 1, 2, 1), (b, big + 1))
    task = TaskSpec('early', 'context_free', 2, 3, early, output_length=lambda n: n + 1,
                    terminated=True)
    b = encoder_layout.encoder_batch(task, jax.random.key(1), jnp.int32(4), batch_size=2, max_length=4)
    np.testing.assert_array_equal(b['accuracy_mask'][0, 4:9], [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(b['output_mask'][0, 4:9], [1, 1, 1, 1, 1])

  def test_padded_slots_share_shapes(self):
    self.assertEqual(encoder_layout.padded_slots(PARITY, 10), 11)
    self.assertEqual(encoder_layout.padded_slots(TERMINATED, 10), 21)
    rev = TaskSpec('r', 'context_free', 2, 2, _parity, output_length=same_length)
    self.assertEqual(encoder_layout.padded_slots(rev, 10), 21)


class NoiseTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(1, 7, 30)
  def test_embedding_positions_equal_theirs_at_every_length(self, t):
    key = jax.random.key(t)
    drawn = encoder_layout.noisy_positions('embedding', key, jnp.full((2,), t), slots=30,
                                   num_layers=3, noise_max_length=256)['positions']
    np.testing.assert_array_equal(drawn[:t], their_noisy_indexes(key, 256, t))
    self.assertTrue(np.all(np.asarray(drawn) < 256))

  def test_rope_draws_per_layer_as_theirs(self):
    key, t = jax.random.key(5), 9
    drawn = encoder_layout.noisy_positions('per_layer', key, jnp.full((2,), t), slots=12,
                                   num_layers=3, noise_max_length=64)['layer_positions']
    keys = jax.random.split(key, 3)
    for i in range(3):
      np.testing.assert_array_equal(drawn[i, :t], their_noisy_indexes(keys[i], 64, t))
    self.assertFalse(np.array_equal(drawn[0], drawn[1]))

  @parameterized.parameters(2, 5, 16)
  def test_alibi_from_distances_equals_their_noisy_alibi(self, t):
    key = jax.random.key(11)
    d = encoder_layout.noisy_positions('distances', key, jnp.full((1,), t), slots=t, num_layers=2,
                               noise_max_length=100)['distances']
    keys = jax.random.split(key, 2)
    enc = ALiBi(4, causal=False, left_offset=0.5)
    for layer in range(2):
      ours = enc.attention_bias(np.arange(t), np.arange(t), distance=d[layer])[0]
      np.testing.assert_allclose(ours, their_noisy_alibi(keys[layer], 4, t, 100), rtol=1e-6,
                                 atol=1e-6)

  def test_distances_of_a_padded_batch_match_the_unpadded_ones(self):
    key = jax.random.key(3)
    short = encoder_layout.noisy_positions('distances', key, jnp.full((1,), 6), slots=6, num_layers=1,
                                   noise_max_length=50)['distances']
    padded = encoder_layout.noisy_positions('distances', key, jnp.full((1,), 6), slots=10,
                                    num_layers=1, noise_max_length=50)['distances']
    np.testing.assert_array_equal(padded[:, :6, :6], short)

  def test_bidirectional_alibi_equals_theirs(self):
    enc = ALiBi(8, causal=False, left_offset=0.5)
    np.testing.assert_allclose(enc.attention_bias(np.arange(7), np.arange(7))[0],
                               their_alibi(8, 7), rtol=1e-6)

  def test_left_offset_refused_for_causal_alibi(self):
    with self.assertRaisesRegex(ValueError, 'left_offset=0.5'):
      ALiBi(4, causal=True, left_offset=0.5)


class EncoderTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters('none', 'sinusoidal', 'rope', 'alibi')
  def test_padding_changes_nothing(self, encoding):
    model = TransformerEncoder(vocab_size=3, output_size=2, d_model=16, num_heads=2,
                               num_layers=2, mlp_dim=32, encoding=encoding, max_positions=32,
                               rngs=nnx.Rngs(0))
    b = encoder_layout.encoder_batch(PARITY, jax.random.key(2), jnp.int32(4), batch_size=3,
                             max_length=9)
    full = model(b['tokens'], lengths=b['lengths'])
    # The unpadded layout has the blank at slot 4, as the padded one.
    alone = model(b['tokens'][:, :5], lengths=b['lengths'])
    chex.assert_trees_all_close(full[:, :5], alone, atol=1e-5)

  def test_causal_only_encoding_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'fox'):
      TransformerEncoder(vocab_size=3, output_size=2, d_model=16, num_heads=2, num_layers=1,
                         mlp_dim=32, encoding='fox', rngs=nnx.Rngs(0))

  @parameterized.parameters(('sinusoidal', 3), ('learned', 3), ('rope', 2), ('alibi', 2),
                            ('relative', 2), ('none', 2))
  def test_embeddings_dropped_only_under_an_added_encoding_as_theirs(self, encoding, drops):
    # Theirs: `add_positional_encodings` drops after adding sin/cos or a learned
    # table, and returns bare embeddings otherwise; each block drops twice.
    model = TransformerEncoder(vocab_size=3, output_size=2, d_model=16, num_heads=2,
                               num_layers=1, mlp_dim=32, encoding=encoding, max_positions=16,
                               dropout_rate=0.1, rngs=nnx.Rngs(0))
    rngs = nnx.Rngs(dropout=0)
    model(jnp.zeros((1, 4), jnp.int32), deterministic=False, rngs=rngs)
    self.assertEqual(int(rngs.dropout.count[...]), drops)

  def test_dropout_without_rngs_is_named(self):
    model = TransformerEncoder(vocab_size=3, output_size=2, d_model=16, num_heads=2,
                               num_layers=1, mlp_dim=32, dropout_rate=0.1, rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'needs the call.s rngs'):
      model(jnp.zeros((1, 4), jnp.int32), deterministic=False)

  def test_bad_layer_positions_named(self):
    model = TransformerEncoder(vocab_size=3, output_size=2, d_model=16, num_heads=2,
                               num_layers=2, mlp_dim=32, encoding='rope', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, r'layer_positions of shape \(3, 5\)'):
      model(jnp.zeros((1, 5), jnp.int32), layer_positions=jnp.zeros((3, 5), jnp.int32))


class ScoresTest(chex.TestCase):

  def test_loss_and_accuracy_equal_theirs(self):
    b = encoder_layout.encoder_batch(TERMINATED, jax.random.key(4), jnp.int32(5), batch_size=6,
                             max_length=5)
    logits = jax.random.normal(jax.random.key(5), b['tokens'].shape + (3,))
    loss, accuracy = encoder.loss_and_accuracy(logits, b)
    # Theirs on the unpadded outputs: the last output_length(n) = 6 slots.
    out, target = np.asarray(logits[:, 5:11]), np.asarray(jax.nn.one_hot(b['targets'][:, 5:11], 3))
    their_loss = np.mean(np.sum(-target * np.asarray(jax.nn.log_softmax(out)), axis=-1))
    stop = np.argmax(np.argmax(target, -1), -1)
    mask = np.arange(6)[None] <= stop[:, None]
    correct = np.argmax(out, -1) == np.argmax(target, -1)
    np.testing.assert_allclose(loss, their_loss, rtol=1e-5)
    np.testing.assert_allclose(accuracy, np.sum(mask * correct) / np.sum(mask), rtol=1e-6)

  def test_official_score_skips_the_first_test_length(self):
    lengths = np.arange(1, 11)
    accuracies = np.arange(10) / 10  # length n scores (n - 1) / 10
    s = encoder.run_scores(lengths, accuracies, train_max_length=4)
    # Theirs: np.mean(accuracies[sequence_length + 1:]) over a list from length 1.
    self.assertAlmostEqual(s['score_official'], np.mean(accuracies[4 + 1:]))
    self.assertAlmostEqual(s['score_plain'], np.mean(accuracies[4:]))
    self.assertAlmostEqual(s['in_range'], np.mean(accuracies[:4]))

  def test_setting_scores_max_mean_std(self):
    runs = [dict(score_official=a, score_plain=a, in_range=1.0) for a in (0.5, 0.9, 0.7)]
    s = encoder.setting_scores(runs)['score_official']
    self.assertAlmostEqual(s['max'], 0.9)
    self.assertAlmostEqual(s['mean'], 0.7)
    self.assertAlmostEqual(s['std'], np.std([0.5, 0.9, 0.7]))


if __name__ == '__main__':
  absltest.main()
