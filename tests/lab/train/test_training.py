"""The train step, evaluation and the study, end to end on tiny models."""

import csv
import gc
import json
import os
import tempfile
import threading
import weakref

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
import pytest
from absl.testing import parameterized
from flax import nnx

import attention_jax
from attention_jax.lab import evaluate
from attention_jax.lab import tasks
from attention_jax.lab import train
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.lab.runs.timing import side_by_side
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.train.interrupt import combined
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import resolve
from tests.lab.configs import with_fields
from configs import copy as copy_config


def _tiny(**overrides):
  return with_fields(copy_config.get_config('scale=tiny'), **overrides)


class LearningTest(absltest.TestCase):

  def test_learns_copy_in_distribution(self):
    c = copy_config.get_config('scale=tiny,encoding=rope')
    c.model.update(d_model=32, num_heads=2, num_layers=2, mlp_dim=64)
    c.task.update(vocab_size=8, train_max_length=4)
    c.train.update(batch_size=32, num_steps=400, learning_rate=3e-3, warmup_steps=40,
                   log_every=100)
    model, _ = train.train(c, progress=False)
    rows = evaluate.evaluate_lengths(model, tasks.get_task('copy'), [1, 2, 3, 4], train_max=4,
                                     num_samples=256, vocab_size=8)
    accuracy = np.mean([r['token_accuracy'] for r in rows])
    self.assertGreaterEqual(accuracy, 0.95, rows)


class EvaluationTest(absltest.TestCase):

  def test_padding_to_a_bucket_does_not_change_results(self):
    c = _tiny()
    model = resolve(c).build_model(0)
    task = tasks.get_task('copy')
    kwargs = dict(num_samples=8, vocab_size=c.task.vocab_size)
    tight = evaluate.evaluate_lengths(model, task, [3, 5], train_max=3, **kwargs)
    padded = evaluate.evaluate_lengths(model, task, [3, 5, 16], train_max=3, **kwargs)
    self.assertEqual(evaluate.buckets([3, 5], 3), {3: [3], 5: [5]})
    self.assertEqual(evaluate.buckets([3, 5, 16], 3), {3: [3], 8: [5], 16: [16]})
    self.assertEqual(tight, padded[:2])

  def test_logits_at_real_tokens_ignore_padding(self):
    c = _tiny()
    model = resolve(c).build_model(0)
    task = tasks.get_task('reverse')
    lengths = jnp.array([2, 3])
    inputs = tasks.make_batch(task, jax.random.key(0), lengths, vocab_size=4,
                              max_input_length=3)['inputs']
    padded = jnp.pad(inputs, ((0, 0), (0, 9)), constant_values=tasks.PAD)
    forward = nnx.jit(lambda model, tokens: model(tokens))
    chex.assert_trees_all_close(forward(model, inputs),
                                forward(model, padded)[:, :inputs.shape[1]], atol=1e-5)

  def test_a_long_sweep_frees_old_evaluation_programs(self):
    """Only the latest `PROGRAMS_KEPT` evaluation functions stay alive; an
    older one is freed with its compiled programs (their code mappings count
    against vm.max_map_count: keeping all of them crashed a 117-run study)."""
    from attention_jax.lab.evaluate import lengths  # pylint: disable=g-import-not-at-top
    graphdef, _ = nnx.split(resolve(_tiny()).build_model(0))
    program = lambda bucket: lengths.evaluation_program(
        graphdef=graphdef, task=tasks.get_task('copy'), bucket=bucket, num_samples=4,
        vocab_size=4)
    first = weakref.ref(program(1000))
    self.assertIs(program(1000), first())  # the lengths of a bucket share one
    for bucket in range(1001, 1001 + lengths.PROGRAMS_KEPT):
      program(bucket)
    gc.collect()
    self.assertIsNone(first())

  def test_default_lengths(self):
    self.assertEqual(evaluate.default_eval_lengths(4, 32),
                     [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32])
    self.assertEqual(evaluate.default_eval_lengths(8, 64),  # the study's 1.25x, 2x, 4x, 8x
                     [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64])
    self.assertEqual(evaluate.default_eval_lengths(8, 20), [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20])


class StopwatchTest(absltest.TestCase):

  def test_compile_seconds_are_counted_once_per_program(self):
    clock = Stopwatch()
    fn = jax.jit(lambda x: jnp.tanh(x) @ x.T + 17.0)
    x = jnp.ones((64, 64))
    with clock.stage('first'):
      fn(x).block_until_ready()
    with clock.stage('again'):  # the same program: XLA's cache, no compile
      fn(x).block_until_ready()
    times = clock.breakdown(share=2)
    self.assertBetween(times['first_compile'], 1e-4, times['first'])
    self.assertEqual(times['again_compile'], 0.0)
    self.assertAlmostEqual(times['first'], clock.wall['first'] / 2)


class SideBySideTest(absltest.TestCase):

  def test_a_stop_of_two_setups_reports_both(self):
    both_running = threading.Barrier(2)

    started = []

    def job(name):
      started.append(name)
      if name == 'c':  # a freed thread must not start the next setup
        raise TrainingInterrupted('stopped by signal 2 before c', 2)
      both_running.wait(timeout=30)  # as in a real stop: both setups were training
      raise TrainingInterrupted(f'stopped by signal 2 after step 5 of 9; checkpoint saved in '
                                f'{name}; run the same command again to resume.', 2)
    with self.assertRaises(TrainingInterrupted) as caught:
      side_by_side(job, ['a', 'b', 'c'], workers=2, combine=combined)
    self.assertCountEqual(started, ['a', 'b'])
    self.assertEqual(caught.exception.args, (
        'stopped by signal 2 after step 5 of 9; checkpoint saved in a; and stopped by '
        'signal 2 after step 5 of 9; checkpoint saved in b; run the same command again to '
        'resume.', 2))
    self.assertEqual(caught.exception.exit_code, 130)

  def test_other_errors_keep_the_first(self):
    def job(name):
      if name == 'a':
        raise ValueError('a broke')
      raise TrainingInterrupted('stopped', 15)
    with self.assertRaisesRegex(ValueError, 'a broke'):
      side_by_side(job, ['a', 'b'], workers=2, combine=combined)
    self.assertEqual(side_by_side(str.upper, ['a', 'b', 'c'], workers=2), ['A', 'B', 'C'])


class StudyTest(absltest.TestCase):

  def test_tiny_study_writes_every_output_and_resumes(self):
    c = _tiny()
    c.study.encodings = ('rope', 'learned:randomized')
    workdir = tempfile.mkdtemp()
    rows = run_study(c, workdir, log=lambda _: None)
    for name in ('results.csv', 'summary.md', 'extrapolation.png'):
      self.assertGreater(os.path.getsize(os.path.join(workdir, name)), 0, name)
    with open(os.path.join(workdir, 'results.csv')) as f:
      table = list(csv.DictReader(f))
    self.assertEqual(list(table[0]), ['task', 'encoding', 'seed', 'length', 'token_accuracy',
                                      'exact_match', 'generated_exact_match',
                                      'generation_agreement', 'config_hash', 'version',
                                      'diverged_at', 'num_steps', 'hard_exact_match'])
    self.assertEqual({(r['diverged_at'], r['num_steps']) for r in table}, {('', '5')})
    # Generation and teacher forcing agree on every sequence (see evaluate/lengths.py).
    self.assertEqual({float(r['generation_agreement']) for r in table}, {1.0})
    self.assertEqual([r['generated_exact_match'] for r in table],
                     [r['exact_match'] for r in table])
    self.assertIn('learned:randomized', {r['encoding'] for r in table})
    self.assertEqual({r['version'] for r in table}, {attention_jax.__version__})
    self.assertLen({r['config_hash'] for r in table}, 2)  # one per encoding
    self.assertEqual(len(table), 2 * 7)  # two encodings, lengths 1…4, 5, 6, 8
    # Where the seconds went, compile time apart, each part of its stage.
    with open(os.path.join(workdir, 'copy/rope/seed0/run.json')) as f:
      times = json.load(f)['time_breakdown']
    self.assertEqual(set(times), {'train', 'train_compile', 'evaluation', 'evaluation_compile',
                                  'generation', 'generation_compile', 'hard', 'hard_compile'})
    for stage in ('train', 'evaluation', 'generation', 'hard'):  # 0 if another test compiled it
      self.assertBetween(times[f'{stage}_compile'], 0, times[stage])
    summary = open(os.path.join(workdir, 'summary.md')).read()
    self.assertIn('| rope | 1 |', summary)
    with open(os.path.join(workdir, 'copy/rope/seed0/metrics.jsonl')) as f:
      steps = [json.loads(line)['step'] for line in f]
    self.assertEqual(steps, list(range(c.train.num_steps)))
    # Finished runs are reused, not retrained.
    messages = []
    again = run_study(c, workdir, log=messages.append)
    self.assertTrue(all('finished earlier' in m for m in messages), messages)
    self.assertEqual(len(again), len(rows))


  @pytest.mark.slow
  def test_seq2seq_models_in_the_sweep(self):
    c = _tiny()
    c.study.models = ('seq2seq', 'seq2seq_attention')
    workdir = tempfile.mkdtemp()
    rows = run_study(c, workdir, log=lambda _: None)
    self.assertEqual(sorted({r['encoding'] for r in rows}), ['seq2seq', 'seq2seq_attention'])
    self.assertTrue(os.path.exists(
        os.path.join(workdir, 'copy/seq2seq_attention/seed0/results.csv')))


class ConfigValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('unknown_task', {'task.name': 'sort'}, r"task.name has 'sort'; allowed: \['addition', 'binary_addition'"),
      ('unknown_encoding', {'model.encoding': 'rotary'}, r"model.encoding: bad encoding 'rotary'"),
      ('heads', {'model.num_heads': 3}, r'model.num_heads=3 must divide model.d_model=16'),
      ('empty_range', {'task.train_min_length': 5},
       r'train_min_length=5 > task.train_max_length=4'),
      ('learned_table', {'model.encoding': 'learned', 'model.max_positions': 12},
       r"model.max_positions=12 is too short for 'learned' at eval.max_length=8"),
      ('eval_length', {'eval.lengths': (3, 9)}, r'eval.lengths contains 9'),
      ('batch', {'train.batch_size': 0}, r'train.batch_size=0 must be an integer >= 1'),
      ('parallel', {'study.parallel_setups': 0}, r'study.parallel_setups=0 must be an integer >= 1'),
      ('odd_rope', {'model.d_model': 6, 'model.num_heads': 2}, r"'rope' needs an even head_dim"),
      ('kind', {'model.kind': 'lstm'}, r"model.kind has 'lstm'; allowed"),
      ('kv_heads', {'model.num_kv_heads': 3},
       r'model.num_kv_heads=3 must divide model.num_heads=2'),
      ('window', {'model.sliding_window': -1}, r'model.sliding_window=-1 must be >= 0'),
      ('rope_scaling', {'eval.rope_scalings': ('linear',)},
       r"eval.rope_scalings has 'linear'; allowed: \['ntk', 'pi', 'yarn', 'yarn_paper'\]"),
      ('randomized_eval', {'positions.randomized_eval': 'shuffled'},
       r"positions.randomized_eval has 'shuffled'; allowed"),
      ('score', {'model.attention_score': 'cosine'}, r"model.attention_score has 'cosine'"),
  )
  def test_bad_config_is_one_clear_error(self, overrides, message):
    c = _tiny(**overrides)
    with self.assertRaisesRegex(ValueError, message):
      validate_config(c)

  def test_study_checks_every_encoding_before_training(self):
    c = _tiny()
    c.study.encodings = ('rope', 'rope:shuffled')
    with self.assertRaisesRegex(ValueError, r"study.encodings: study entry 'rope:shuffled': no "
                                            r"part 'shuffled'"):
      run_study(c, tempfile.mkdtemp(), log=lambda _: None)

  def test_bad_preset(self):
    with self.assertRaisesRegex(ValueError, r"bad config argument 'model=big'"):
      copy_config.get_config('model=big')


if __name__ == '__main__':
  absltest.main()
