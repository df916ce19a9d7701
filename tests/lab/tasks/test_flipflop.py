"""Flip-flop language modeling (`lab/tasks/flipflop.py`, configs/flipflop.py):
the sequences follow the paper's rules, the loss sees only the read bits,
the sparse and dense sets score the same models, and the tiny study runs."""

import os
import tempfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.config import facts
from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab import tasks
from attention_jax.lab.config import validate
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.tasks import flipflop
from attention_jax.lab.config.resolved import resolve
from configs import flipflop as flipflop_config

N = 48  # instructions per drawn sequence


def _draw(name, lengths, seed=0):
  task = tasks.get_task(name)
  return task.example(jax.random.key(seed), jnp.asarray(lengths, jnp.int32), 2, N)


def _replay(tokens):
  """The read bits a 1-bit register returns for each sequence (plain Python),
  and each sequence's instructions, from int tokens `[T]`."""
  register, reads, kinds = None, [], []
  for p in range(1, len(tokens) - 1, 2):
    kind, bit = int(tokens[p]), int(tokens[p + 1]) - flipflop.BIT0
    if kind == 0:  # PAD: past the sequence
      break
    kinds.append('wri'[kind - flipflop.WRITE])
    if kinds[-1] == 'w':
      register = bit
    elif kinds[-1] == 'r':
      reads.append((p + 1, register))
  return reads, kinds


class FlipFlopTaskTest(chex.TestCase, parameterized.TestCase):

  @parameterized.parameters('flipflop', 'flipflop_sparse', 'flipflop_dense')
  def test_sequences_follow_the_register_and_the_mask_is_the_read_bits(self, name):
    lengths = np.random.default_rng(0).integers(2, N + 1, 64)
    tokens, is_output = map(np.asarray, _draw(name, lengths))
    chex.assert_shape(tokens, (64, 2 * N + 1))
    for row, out, n in zip(tokens, is_output, lengths):
      reads, kinds = _replay(row)
      self.assertLen(kinds, n)
      self.assertEqual((kinds[0], kinds[-1]), ('w', 'r'))  # the canonical form
      self.assertEqual(row[0], tasks.BOS)
      self.assertTrue(np.all(row[2 * n + 1:] == tasks.PAD))
      self.assertEqual(sorted(np.flatnonzero(out)), [p for p, _ in reads])
      for p, bit in reads:
        self.assertEqual(row[p] - flipflop.BIT0, bit)

  @parameterized.parameters(('flipflop', 0.8), ('flipflop_sparse', 0.98),
                            ('flipflop_dense', 0.1))
  def test_instruction_frequencies_are_the_distributions(self, name, p_ignore):
    tokens, _ = _draw(name, np.full(512, N), seed=1)
    middle = np.asarray(tokens)[:, 3:2 * N - 1:2]  # the drawn instructions (not first, last)
    share = lambda k: float(np.mean(middle == k))
    self.assertAlmostEqual(share(flipflop.IGNORE), p_ignore, delta=0.01)
    self.assertAlmostEqual(share(flipflop.WRITE), (1 - p_ignore) / 2, delta=0.01)
    self.assertAlmostEqual(share(flipflop.READ), (1 - p_ignore) / 2, delta=0.01)

  def test_batches_score_only_the_read_bits(self):
    task = facts.configured_task(flipflop_config.get_config('scale=tiny'))
    batch = tasks.make_batch(task, jax.random.key(3), jnp.asarray([6, 2]), vocab_size=2,
                             max_input_length=6)
    mask, inputs, targets = map(np.asarray, (batch['loss_mask'], batch['inputs'],
                                             batch['targets']))
    self.assertTrue(np.all(inputs[mask] == flipflop.READ))  # a read predicts its bit
    self.assertTrue(np.all((targets[mask] == flipflop.BIT0) | (targets[mask] == flipflop.BIT0 + 1)))
    self.assertEqual(int(mask[1].sum()), 1)  # 'w b r b': one read

  def test_text_round_trip_and_bad_text(self):
    task = tasks.get_task('flipflop')
    tokens, is_output, n = task.encode('w1i0r1')
    self.assertEqual(np.asarray(tokens).tolist(),
                     [[tasks.BOS, flipflop.WRITE, 8, flipflop.IGNORE, 7, flipflop.READ, 8]])
    self.assertEqual(np.asarray(is_output).tolist(), [[False] * 6 + [True]])
    self.assertEqual(int(n[0]), 3)
    self.assertEqual(task.decode([8, 7]), [1, 0])
    self.assertIsNone(task.decode([flipflop.READ]))
    for bad in ('i1r1', 'w1i0', 'w1x0r1', 'w2r1', 'w1r'):
      with self.assertRaisesRegex(ValueError, 'is not a flip-flop sequence'):
        task.encode(bad)

  @parameterized.named_parameters(
      ('p_ignore_one', 'task.p_ignore', 1.0, r'task.p_ignore=1.0 must be a probability'),
      ('p_ignore_negative', 'task.p_ignore', -0.1, r'task.p_ignore=-0.1 must be a probability'),
      ('alphabet', 'task.vocab_size', 3, r'task.vocab_size=3: flip-flop'),
      ('one_instruction', 'task.train_min_length', 1, r'task.train_min_length=1: a flip-flop'),
      ('other_layout', 'eval.tasks', ('copy',), r"eval.tasks has 'copy', whose tokens"),
      ('unknown', 'eval.tasks', ('flipflap',), r"unknown task 'flipflap'"),
      ('layer_pattern', 'model.encoding_layers', 'rope/0,none',
       r"model.encoding_layers='rope/0,none': the window in 'rope/0' must be an integer"),
  )
  def test_bad_options_are_refused_naming_them(self, field, value, message):
    c = flipflop_config.get_config('scale=tiny')
    section, name = field.split('.')
    c[section][name] = value
    with self.assertRaisesRegex((ValueError, ConfigError), message):
      validate.validate_config(c)

  def test_the_trained_distribution_is_the_configs_and_siblings_keep_theirs(self):
    c = flipflop_config.get_config('scale=tiny')
    c.task.p_ignore = 0.5
    found = {t.name: t.p_ignore for t in facts.evaluation_tasks(c)}
    self.assertEqual(found, {'flipflop': 0.5, 'flipflop_sparse': 0.98, 'flipflop_dense': 0.1})

  def test_one_runs_table_has_a_block_per_task_scored(self):
    rows = [dict(task=t, encoding='rope', seed=0, length=n, token_accuracy=1.0, exact_match=1.0)
            for t in ('flipflop', 'flipflop_sparse') for n in (4, 8)]
    blocks = results.run_table(rows).split('\n\n')
    self.assertEqual([b.splitlines()[0] for b in blocks],
                     ['rope (flipflop, seed 0):', 'rope (flipflop_sparse, seed 0):'])
    self.assertEqual([len(b.splitlines()) for b in blocks], [4, 4])

  def test_hybrid_entry_builds_its_layer_pattern(self):
    c = flipflop_config.get_config('encoding=rnope_swa')
    self.assertEqual([tuple(s) for s in resolve(c).build_model(0).layer_specs],
                     [('rope', 4), (None, None)])
    paper = flipflop_config.get_config('encoding=rnope_swa,scale=paper')
    self.assertEqual(paper.model.encoding_layers, 'rope/32,rope/32,rope/32,none')


@pytest.mark.slow
class FlipFlopStudyTest(absltest.TestCase):

  def test_tiny_study_finishes_with_every_evaluation_set(self):
    workdir = tempfile.mkdtemp()
    c = flipflop_config.get_config('scale=tiny')
    c.study.encodings = ('path', 'rnope_swa')
    c.study.parallel_setups = 1
    rows = run_study(c, workdir, log=lambda m: None)
    for name in ('results.csv', 'summary.md', 'extrapolation.png'):
      self.assertTrue(os.path.exists(os.path.join(workdir, name)), name)
    self.assertEqual({(r['task'], r['encoding'], r['length']) for r in rows},
                     {(t, e, n) for t in ('flipflop', 'flipflop_sparse', 'flipflop_dense')
                      for e in ('path', 'rnope_swa') for n in (4, 8)})
    self.assertEqual(len(result_files.read_rows(os.path.join(workdir, 'results.csv'))), len(rows))
    with open(os.path.join(workdir, 'summary.md')) as f:
      summary = f.read()
    for task in ('flipflop', 'flipflop_sparse', 'flipflop_dense'):
      self.assertIn(f'### {task}: token accuracy', summary)


if __name__ == '__main__':
  absltest.main()
