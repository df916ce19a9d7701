"""One kind of task, two protocols: every `TaskSpec` (copy, reverse,
duplicate and DeepMind's 15) laid out for the causal decoder and for the
bidirectional encoder from the same draw, and the copy family as specs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks
from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.tasks import copy

from tests import tiers

_LENGTHS = np.array([1, 2, 5, 6])
_N = 6


def _draw(spec, seed=0):
  x, y = spec.sample_examples(jax.random.key(seed), jnp.asarray(_LENGTHS, jnp.int32), _N)
  return np.asarray(x), np.asarray(y)


class TaskKindsTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(*tasks.SPECS)
  @tiers.fast_cases(4)  # every other task in the slow tier
  def test_decoder_layout_holds_the_specs_draw(self, name):
    spec, task = tasks.get_spec(name), tasks.get_task(name)
    x, y = _draw(spec)
    tokens, is_output = map(np.asarray, task.example(
        jax.random.key(0), jnp.asarray(_LENGTHS, jnp.int32), spec.input_size, _N))
    first_class = tasks.NUM_SPECIAL + (0 if spec.copies_inputs else spec.input_size)
    for row, n in enumerate(_LENGTHS):
      nx, ny = int(spec.input_length(n)), int(spec.output_length(n))
      want = ([tasks.BOS] + list(tasks.NUM_SPECIAL + x[row, :nx]) + [tasks.SEP]
              + list(first_class + y[row, :ny]) + [tasks.EOS])
      np.testing.assert_array_equal(tokens[row, :len(want)], want)
      np.testing.assert_array_equal(tokens[row, len(want):], tasks.PAD)
      np.testing.assert_array_equal(np.flatnonzero(is_output[row]),
                                    np.arange(nx + 2, nx + 3 + ny))

  @parameterized.parameters(*tasks.SPECS)
  @tiers.fast_cases(4)
  def test_encoder_layout_holds_the_specs_draw(self, name):
    spec = tasks.get_spec(name)
    n = 5
    x, y = map(np.asarray, spec.sample(jax.random.key(1), jnp.int32(n), 3, _N))
    batch = encoder_layout.encoder_batch(spec, jax.random.key(1), n, batch_size=3, max_length=_N)
    nx, ny = int(spec.input_length(n)), int(spec.output_length(n))
    tokens = np.asarray(batch['tokens'])
    np.testing.assert_array_equal(tokens[:, :nx], x[:, :nx])
    np.testing.assert_array_equal(tokens[:, nx:], spec.input_size)  # blanks, then padding
    np.testing.assert_array_equal(np.asarray(batch['targets'])[:, nx:nx + ny], y[:, :ny])
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(batch['output_mask'])[0]),
                                  np.arange(nx, nx + ny))

  @parameterized.parameters(*tasks.SPECS)
  def test_draws_are_in_the_alphabets_and_zero_past_the_length(self, name):
    spec = tasks.get_spec(name)
    x, y = _draw(spec, seed=3)
    self.assertTrue(((0 <= x) & (x < spec.input_size)).all())
    self.assertTrue(((0 <= y) & (y < spec.output_size)).all())
    for row, n in enumerate(_LENGTHS):
      np.testing.assert_array_equal(x[row, int(spec.input_length(n)):], 0)
      np.testing.assert_array_equal(y[row, int(spec.output_length(n)):], 0)

  @parameterized.parameters(('copy', lambda s, n: s), ('reverse', lambda s, n: s[::-1]),
                            ('duplicate', lambda s, n: np.concatenate([s, s])))
  def test_copy_family_outputs_follow_their_rule(self, name, rule):
    spec = tasks.get_spec(name).with_alphabet(3)
    self.assertEqual((spec.input_size, spec.output_size), (3, 3))
    x, y = _draw(spec, seed=5)
    self.assertLess(x.max(), 3)
    for row, n in enumerate(_LENGTHS):
      np.testing.assert_array_equal(y[row, :spec.output_length(n)], rule(x[row, :n], n))

  def test_one_length_draw_is_the_per_example_draw_at_that_length(self):
    spec = tasks.get_spec('reverse')
    got = spec.sample(jax.random.key(2), jnp.int32(4), 3, _N)
    want = spec.sample_examples(jax.random.key(2), jnp.full((3,), 4, jnp.int32), _N)
    chex.assert_trees_all_equal(got, want)

  def test_copy_family_shares_ids_and_classification_has_its_own(self):
    self.assertEqual(tasks.get_task('copy').num_symbols(16), 16)
    self.assertEqual(tasks.get_task('parity_check').num_symbols(16), 2 + 2)
    self.assertTrue(tasks.get_task('reverse').has_seq2seq and tasks.get_task('copy').ceiling)
    self.assertFalse(tasks.get_task('reverse_string').ceiling)

  def test_copying_task_refuses_an_output_length_that_is_not_its_factor(self):
    with self.assertRaisesRegex(ValueError, r'output_length must be Times\(output_factor\)'):
      copy.CopyingTask('bad', 'regular', 4, 4, output_length=copy.Times(1), output_factor=2)

  def test_a_registered_task_is_served_by_both_protocols(self):
    def last_symbol(key, n, b, big):
      x = jax.random.randint(key, (b, big), 0, 3)
      x = jnp.where(jnp.arange(big)[None] < n, x, 0)
      return x, jnp.take_along_axis(x, jnp.full((b, 1), n - 1), axis=1)
    spec = tasks.TaskSpec('last_symbol_test', 'regular', 3, 3, last_symbol)
    tasks.register_task(spec)
    self.addCleanup(tasks.TASKS.pop, spec.name)
    self.addCleanup(tasks.SPECS.pop, spec.name)
    self.assertIs(tasks.get_spec('last_symbol_test'), spec)
    self.assertIs(tasks.get_task('last_symbol_test').spec, spec)
    tokens, _ = tasks.get_task('last_symbol_test').example(jax.random.key(0), jnp.array([3]), 3, 4)
    self.assertEqual(int(tokens[0, 5]), tasks.NUM_SPECIAL + 3 + int(tokens[0, 3]) - tasks.NUM_SPECIAL)
    with self.assertRaisesRegex(ValueError, "'last_symbol_test' is registered already"):
      tasks.register_task(spec)
    with self.assertRaisesRegex(ValueError, "level='cs'; choose one of"):
      tasks.register_task(tasks.TaskSpec('other_test', 'cs', 3, 3, last_symbol))

  def test_unknown_spec_lists_the_known_ones(self):
    with self.assertRaisesRegex(ValueError, r"unknown task 'copyy'.*'copy'.*'bucket_sort'"):
      tasks.get_spec('copyy')

  def test_seq2seq_layout_is_refused_for_a_task_without_one(self):
    with self.assertRaisesRegex(ValueError, r"'parity_check' has no encoder-decoder layout"):
      tasks.make_seq2seq_batch(tasks.get_task('parity_check'), jax.random.key(0),
                               jnp.array([2]), vocab_size=2, max_input_length=4)


if __name__ == '__main__':
  absltest.main()
