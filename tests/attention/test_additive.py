"""Bahdanau (additive) and Luong (dot) attention, and the seq2seq models."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax as aj
from attention_jax.lab import tasks
from attention_jax.lab.protocols import decoder
from attention_jax.lab import train
from attention_jax.lab.evaluate import evaluate_lengths
from attention_jax.lab.evaluate import seq2seq_alignment
from attention_jax.nn.seq2seq import Seq2Seq
from configs import copy as copy_config


class AdditiveFunctionsTest(chex.TestCase, parameterized.TestCase):

  def test_hand_computed_example(self):
    # Two encoder states, A = 1: e_j = v tanh(w s + u h_j) with v = 2, w s = 0.5.
    keys_proj = jnp.array([[0.0], [1.0]])  # u h_j
    scores = aj.attention.additive_scores(jnp.array([0.5]), keys_proj, jnp.array([2.0]))
    np.testing.assert_allclose(scores, [2 * np.tanh(0.5), 2 * np.tanh(1.5)], rtol=1e-6)
    values = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    context, weights = aj.attention.attend(scores, values)
    e = np.exp([2 * np.tanh(0.5), 2 * np.tanh(1.5)])
    np.testing.assert_allclose(weights, e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(context, e / e.sum(), rtol=1e-6)  # values = I

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*aj.nn.additive.SCORES)
  def test_weights_sum_to_one_and_vanish_on_padding(self, score):
    module = aj.nn.additive.AdditiveAttention(6, 6, 5, score=score, rngs=nnx.Rngs(0))
    query = jax.random.normal(jax.random.key(0), (3, 6))
    keys = jax.random.normal(jax.random.key(1), (3, 7, 6))
    mask = jnp.arange(7)[None, :] < jnp.array([7, 4, 1])[:, None]
    context, weights = self.variant(lambda q, k: module(q, k, mask=mask))(query, keys)
    chex.assert_shape(context, (3, 6))
    chex.assert_shape(weights, (3, 7))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(weights)[~np.asarray(mask)], 0.0)
    np.testing.assert_allclose(context, jnp.einsum('bt,btd->bd', weights, keys), atol=1e-6)

  def test_fully_masked_row_is_zero(self):
    context, weights = aj.attention.attend(jnp.ones((4,)), jnp.ones((4, 3)), jnp.zeros(4, bool))
    np.testing.assert_array_equal(weights, 0.0)
    np.testing.assert_array_equal(context, 0.0)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "score='dot' needs query_dim == key_dim, got 4 and 6"):
      aj.nn.additive.AdditiveAttention(4, 6, score='dot', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, "score='cosine'"):
      aj.nn.additive.AdditiveAttention(4, 6, score='cosine', rngs=nnx.Rngs(0))
    with self.assertRaisesRegex(ValueError, 'disagree on the number of encoder positions'):
      aj.attention.attend(jnp.ones((3,)), jnp.ones((4, 2)))


def _model(attention, bidirectional=False):
  return Seq2Seq(vocab_size=9, embed_dim=8, hidden_dim=16, attention=attention,
                 start_token=tasks.BOS, bidirectional=bidirectional, rngs=nnx.Rngs(0))


def _batch(lengths=(3, 5), max_length=5):
  return tasks.make_seq2seq_batch(tasks.get_task('copy'), jax.random.key(0),
                                  jnp.array(lengths), vocab_size=5,
                                  max_input_length=max_length)


class Seq2SeqTest(parameterized.TestCase):

  @parameterized.product(attention=(False, True), bidirectional=(False, True))
  def test_shapes_and_greedy_agrees_with_teacher_forcing(self, attention, bidirectional):
    model, batch = _model(attention, bidirectional), _batch()
    logits = decoder.forward_batch(model, batch)
    chex.assert_shape(logits, (2, 6, 9))
    # Feeding the greedy predictions back as decoder inputs reproduces them.
    predictions = decoder.predict_batch(model, batch)
    teacher = jnp.concatenate([batch['decoder_inputs'][:, :1], predictions[:, :-1]], 1)
    np.testing.assert_array_equal(
        jnp.argmax(model(batch['source'], batch['source_mask'], teacher), -1), predictions)

  def test_without_attention_the_decoder_sees_only_the_final_state(self):
    """Gradient of every output w.r.t. the encoder states: without attention,
    zero everywhere but at each sequence's last real position."""
    batch = _batch(lengths=(3, 5))
    last = batch['lengths'] - 1
    for attention in (False, True):
      model = _model(attention)
      states, s0 = model.encode(batch['source'], batch['source_mask'])
      # For a one-way GRU the encoder's final state is its output at the last real token.
      chex.assert_trees_all_close(jnp.tanh(model.bridge(states[jnp.arange(2), last])), s0,
                                  atol=1e-6)

      def outputs(model, states):
        s0 = jnp.tanh(model.bridge(states[jnp.arange(2), last]))
        return model.decode(states, s0, batch['source_mask'], batch['decoder_inputs']).sum()

      grad_norm = np.asarray(jnp.linalg.norm(nnx.grad(outputs, argnums=1)(model, states), axis=-1))  # [B, N]
      is_last = np.arange(5)[None, :] == np.asarray(last)[:, None]
      self.assertTrue(np.all(grad_norm[is_last] > 0))
      if attention:
        self.assertGreater(grad_norm[~is_last & np.asarray(batch['source_mask'])].min(), 0.0)
      else:
        np.testing.assert_array_equal(grad_norm[~is_last], 0.0)

  def test_padding_does_not_change_the_encoding(self):
    model = _model(True, bidirectional=True)
    short, long = _batch((3,), 3), _batch((3,), 7)
    np.testing.assert_array_equal(short['source'], long['source'][:, :3])
    s_short, h_short = model.encode(short['source'], short['source_mask'])
    s_long, h_long = model.encode(long['source'], long['source_mask'])
    chex.assert_trees_all_close(h_short, h_long, atol=1e-6)
    chex.assert_trees_all_close(s_short, s_long[:, :3], atol=1e-6)

  @pytest.mark.slow
  def test_alignment_needs_attention(self):
    with self.assertRaisesRegex(ValueError, "model.kind='seq2seq_attention'"):
      seq2seq_alignment(_model(False), tasks.get_task('copy'), 3, vocab_size=5)
    a = seq2seq_alignment(_model(True), tasks.get_task('copy'), 3, vocab_size=5)
    chex.assert_shape(a['weights'], (4, 3))


class Seq2SeqLearningTest(absltest.TestCase):

  @pytest.mark.slow
  def test_attention_model_learns_copy(self):
    c = copy_config.get_config('scale=tiny')
    c.model.update(kind='seq2seq_attention', d_model=16, rnn_hidden_dim=32)
    c.task.update(vocab_size=6, train_max_length=4)
    c.train.update(batch_size=32, num_steps=400, learning_rate=1e-2, warmup_steps=20,
                   log_every=100)
    model, _ = train.train(c, progress=False)
    rows = evaluate_lengths(model, tasks.get_task('copy'), [1, 2, 3, 4], train_max=4,
                            num_samples=256, vocab_size=6)
    self.assertGreaterEqual(np.mean([r['token_accuracy'] for r in rows]), 0.95, rows)


if __name__ == '__main__':
  absltest.main()
