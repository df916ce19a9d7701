"""Synthetic tasks: layout, rules, determinism."""

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks

RULES = {
    'copy': lambda x: x,
    'reverse': lambda x: x[::-1],
    'duplicate': lambda x: x + x,
}


def _batch(name, seed=0, step=0, batch_size=16, max_length=6):
  return tasks.train_batch(tasks.get_task(name), seed, jnp.int32(step),
                           batch_size=batch_size, min_length=1,
                           max_length=max_length, vocab_size=5)


class TasksTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters(*sorted(RULES))
  def test_every_example_follows_the_rule(self, name):
    batch = _batch(name)
    t = tasks.sequence_length(tasks.get_task(name), 6) - 1
    chex.assert_shape([batch['inputs'], batch['targets'], batch['loss_mask']], (16, t))
    tokens = np.concatenate([batch['inputs'][:, :1], batch['targets']], axis=1)
    for row, mask, n in zip(tokens, np.asarray(batch['loss_mask']), np.asarray(batch['lengths'])):
      x = list(row[1:n + 1])
      y = RULES[name](x)
      self.assertEqual(row[0], tasks.BOS)
      self.assertEqual(row[n + 1], tasks.SEP)
      self.assertEqual(list(row[n + 2:n + 2 + len(y)]), y)
      self.assertEqual(row[n + 2 + len(y)], tasks.EOS)
      np.testing.assert_array_equal(row[n + 3 + len(y):], tasks.PAD)
      self.assertTrue(all(tasks.NUM_SPECIAL <= s < tasks.NUM_SPECIAL + 5 for s in x))
      # The loss covers exactly y and EOS (as targets, shifted by one).
      np.testing.assert_array_equal(np.flatnonzero(mask), np.arange(n + 1, n + 2 + len(y)))

  def test_lengths_cover_the_range(self):
    lengths = np.asarray(_batch('copy', batch_size=512)['lengths'])
    self.assertEqual(set(lengths.tolist()), set(range(1, 7)))

  @parameterized.parameters(*sorted(RULES))
  def test_same_seed_and_step_same_batch(self, name):
    chex.assert_trees_all_equal(_batch(name, seed=3, step=7), _batch(name, seed=3, step=7))
    a, b = _batch(name, seed=3, step=7), _batch(name, seed=3, step=8)
    self.assertFalse(np.array_equal(a['inputs'], b['inputs']))
    c = _batch(name, seed=4, step=7)
    self.assertFalse(np.array_equal(a['inputs'], c['inputs']))

  def test_unknown_task(self):
    with self.assertRaisesRegex(ValueError, r"unknown task 'sort'; choose one of \['addition', 'binary_addition'"):
      tasks.get_task('sort')


if __name__ == '__main__':
  absltest.main()
