"""The hard evaluation set: the cases it names, batches that hold them, a
predictor failing only the top-digit carry exposed there while the uniform
evaluation looks fine, an older finished workdir scored on a rerun without
training, and the tables' worst-seed cells."""

import csv
import os
import tempfile

import jax
import numpy as np
import pytest
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab import tasks
from attention_jax.lab.evaluate import eval_lengths
from attention_jax.lab.evaluate import hard
from attention_jax.lab.report import hard_report
from attention_jax.lab.evaluate.scoring import prediction_metrics
from attention_jax.lab.tasks import addition
from attention_jax.lab.tasks import hard_cases
from attention_jax.lab.config.resolved import resolve


def _digits(v):
  return len(str(v))


def _carry_into(a, b, column):
  """Whether column `column` (0 = units) of a + b receives a carry."""
  low = 10 ** column
  return (a % low) + (b % low) >= low


class AdditionCasesTest(parameterized.TestCase):

  @parameterized.parameters(1, 2, 3, 12)
  def test_hard_addition_cases_are_the_named_sums(self, n):
    found = hard_cases.addition_cases(n)
    by_case = {}
    for case, (a, b) in found:
      by_case.setdefault(case, []).append((a, b))
      self.assertEqual(max(_digits(a), _digits(b)), n, (case, a, b))
    nines = 10 ** n - 1
    self.assertEqual(by_case['9…9 + 1'], [(nines, 1)])
    self.assertEqual(by_case['1 + 9…9'], [(1, nines)])
    self.assertEqual(by_case['9…9 + 9…9'], [(nines, nines)])
    for a, b in by_case['sum gains a digit']:
      self.assertEqual(_digits(a + b), n + 1)
    for a, b in by_case['0 + n digits']:
      self.assertEqual((a, _digits(b)), (0, n))
    for a, b in by_case['n digits + 0']:
      self.assertEqual((_digits(a), b), (n, 0))
    if n == 1:
      self.assertEqual(by_case['0 + 0'], [(0, 0)])
      self.assertNotIn('9…9 + 9…9 (n−1)', by_case)
      self.assertNotIn('carry into the top digit', by_case)
      return
    self.assertNotIn('0 + 0', by_case)
    self.assertEqual(by_case['9…9 + 9…9 (n−1)'], [(nines, 10 ** (n - 1) - 1)])
    self.assertEqual(by_case['9…9 (n−1) + 9…9'], [(10 ** (n - 1) - 1, nines)])
    for a, b in by_case['carry into the top digit']:
      self.assertTrue(_carry_into(a, b, n - 1), (a, b))
      self.assertEqual((_digits(a), _digits(b)), (n, n))
    for a, b in by_case['carry chain into the top digit']:
      self.assertTrue(all(_carry_into(a, b, k) for k in range(1, n)), (a, b))
    for a, b in by_case['1 digit + n digits']:
      self.assertEqual((_digits(a), _digits(b)), (1, n))
    for a, b in by_case['n digits + 1 digit']:
      self.assertEqual((_digits(a), _digits(b)), (n, 1))
    if n >= 3:
      self.assertIn((10 ** (n - 1) + 1, 10 ** (n - 1) + 1), by_case['internal zeros'])
      for a, b in by_case['internal zeros']:
        self.assertIn('0', str(a)[1:-1] + str(b)[1:-1])
    # The same sums on every call: every model and rerun is scored on them.
    self.assertEqual(found, hard_cases.addition_cases(n))


class StringCasesTest(parameterized.TestCase):

  @parameterized.parameters(5, 17, 18, 40)
  def test_hard_strings_are_low_entropy_as_named(self, n):
    found = hard_cases.string_cases(n, vocab_size=16)
    names = {c for c, _ in found}
    for case, x in found:
      self.assertLen(x, n)
      self.assertTrue(all(0 <= s < 16 for s in x))
      if case == 'one symbol':
        self.assertLen(set(x), 1)
      elif case == 'two symbols':
        self.assertLessEqual(len(set(x)), 2)
      elif case.startswith('period'):
        p = int(case.split()[1])
        self.assertTrue(all(x[i] == x[i + p] for i in range(n - p)))
        self.assertLen(set(x), p)
      elif case == 'repeated 8-gram':
        pairs = [(i, j) for i in range(n - 8) for j in range(i + 1, n - 8)
                 if x[i:i + 8] == x[j:j + 8] and x[i + 8] != x[j + 8]]
        self.assertNotEmpty(pairs, x)
    self.assertIn('one symbol', names)
    self.assertEqual('repeated 8-gram' in names, n >= 18)
    self.assertEqual('period 3' in names, n >= 6)


class HardBatchesTest(parameterized.TestCase):

  @parameterized.parameters(dict(), dict(coupled_max_position=20), dict(pad_zeros=True),
                            dict(index_hints=True, num_hints=12),
                            dict(reverse_operands=False))
  def test_hard_addition_batches_hold_the_sums(self, **options):
    import dataclasses  # pylint: disable=import-outside-toplevel
    task = dataclasses.replace(tasks.get_task('addition'), **options)
    coupled = bool(options.get('coupled_max_position'))
    lengths = [1, 3, 5]
    batches = hard.hard_batches(task, lengths, train_max=3, vocab_size=10)
    expected = [x for n in lengths for x in hard_cases.addition_cases(n)]
    got = []
    for labels, batch in batches:
      self.assertEqual('positions' in batch, coupled)
      targets, mask = np.asarray(batch['targets']), np.asarray(batch['loss_mask'])
      inputs = np.asarray(batch['inputs'])
      for row, (n, case) in enumerate(labels):
        written = [int(t) for t in targets[row][mask[row]]]
        self.assertEqual(written[-1], tasks.EOS)
        got.append((n, case, task.decode(written[:-1])))
        self.assertEqual(list(inputs[row]).count(addition.PLUS), 1)
    self.assertEqual([(c, a + b) for c, (a, b) in expected], [g[1:] for g in got])

  @parameterized.parameters('copy', 'reverse', 'duplicate')
  def test_hard_string_batches_hold_the_rule(self, name):
    task = tasks.get_task(name)
    for layout in ('decoder_only', 'seq2seq'):
      (labels, batch), = hard.hard_batches(task, [4, 6], train_max=8, vocab_size=16,
                                           layout=layout)
      strings = [x for n in (4, 6) for _, x in hard_cases.string_cases(n, 16)]
      self.assertLen(labels, len(strings))
      targets, mask = np.asarray(batch['targets']), np.asarray(batch['loss_mask'])
      for row, x in enumerate(strings):
        y = {'copy': x, 'reverse': x[::-1], 'duplicate': x + x}[name]
        written = [int(t) - tasks.NUM_SPECIAL for t in targets[row][mask[row]]]
        self.assertEqual(written, y + [tasks.EOS - tasks.NUM_SPECIAL])

  def test_tasks_without_a_hard_set_give_none(self):
    self.assertEqual(hard.hard_batches(tasks.get_task('parity_check'), [3], train_max=3,
                                       vocab_size=2), [])


def _top_carry_failure(batch):
  """A predictor right everywhere except where the top column of the
  longer operand sums to 9 without its carry and receives one (999 + 99,
  9…9 + 1): it ignores that carry and stops, as the issue's failing seed
  does. Teacher-forced predictions `[B, T]`."""
  inputs, targets = np.asarray(batch['inputs']), np.asarray(batch['targets'])
  mask = np.asarray(batch['loss_mask'])
  predictions = targets.copy()
  decode = tasks.get_task('addition').decode
  for row in range(inputs.shape[0]):
    tokens = list(inputs[row])
    plus, equals = tokens.index(addition.PLUS), tokens.index(tasks.SEP)
    a, b = decode(tokens[1:plus]), decode(tokens[plus + 1:equals])
    n = max(len(str(a)), len(str(b)))
    top = a // 10 ** (n - 1) % 10 + b // 10 ** (n - 1) % 10
    if top == 9 and _carry_into(a, b, n - 1):
      first = int(np.argmax(mask[row]))
      predictions[row, first + n - 1] = targets[row, first + n - 1] + 1  # wrong top digit
  return predictions


class FailureExposedTest(absltest.TestCase):

  def test_hard_set_exposes_a_model_failing_only_the_top_carry(self):
    task = tasks.get_task('addition')
    lengths = [2, 5, 10, 20]
    batches = hard.hard_batches(task, lengths, train_max=10, vocab_size=10)
    rows = []
    for labels, batch in batches:
      exact = prediction_metrics(_top_carry_failure(batch), batch, per_example=True)['exact']
      rows += hard.score(labels, exact)
    for n in lengths:
      uniform = tasks.make_batch(task, jax.random.key(n), task.fixed_lengths(n, 256),
                                 vocab_size=10, max_input_length=max(n, 10))
      scores = prediction_metrics(_top_carry_failure(uniform), uniform)
      self.assertGreater(float(scores['exact_match']), 0.9, n)  # looks fine
      at_n = [r for r in rows if r['length'] == n]
      total = sum(r['exact_match'] * r['count'] for r in at_n) / sum(r['count'] for r in at_n)
      self.assertLess(total, 0.9, n)
      failed = {r['case'] for r in at_n if r['exact_match'] < 1}
      self.assertContainsSubset({'9…9 + 1', '1 + 9…9', '9…9 + 9…9 (n−1)'}, failed)
      self.assertNoCommonElements({'0 + n digits', 'n digits + 0'}, failed)
    # The table says so: uniform beside hard, the failing seed named.
    table = [dict(task='addition', encoding='coupled', seed=0, length=r['length'],
                  **{k: r[k] for k in ('case', 'count', 'exact_match')}) for r in rows]
    table += [dict(r, seed=1, exact_match=1.0) for r in table]
    text = hard_report.hard_markdown(table)
    self.assertIn('| coupled | 1 of 2 |', text)
    self.assertIn('| coupled | 0 | 2 | 9…9 + 1, 1 + 9…9', text)


def _row(seed, length, exact, hard_exact=None, encoding='rope', diverged_at=None):
  return dict(task='copy', encoding=encoding, seed=seed, length=length, token_accuracy=exact,
              exact_match=exact, generated_exact_match=None, generation_agreement=None,
              config_hash='x', version='0', diverged_at=diverged_at, num_steps=5,
              hard_exact_match=hard_exact)


class TablesTest(absltest.TestCase):

  def test_worst_seed_cell_and_one_seed_without_std(self):
    self.assertEqual(results.cell([0.9, 1.0, 0.5]), '80.0 ± 21.6, worst 50.0')
    self.assertEqual(results.cell([0.25]), '25.0')
    self.assertEqual(results.cell([]), '—')
    rows = [_row(s, n, e, h) for s, e, h in ((0, 1.0, 1.0), (1, 0.9, 0.4))
            for n in (1, 2, 4)]
    text = results.summary_markdown(rows, 1, 2, hard_sets={'copy': 'low-entropy strings'})
    self.assertIn('### copy: hard cases, exact match', text)
    self.assertIn('(tasks/hard_cases.py: low-entropy strings)', text)
    # 1–L: seed 0 100, seed 1 90 (exact), 40 (hard); the worst seed beside the mean.
    self.assertIn('| rope | 2 | 95.0 ± 5.0, worst 90.0 |', text)
    self.assertIn('| rope | 2 | 70.0 ± 30.0, worst 40.0 |', text)
    one = results.summary_markdown([_row(0, 1, 0.5)], 1, 2)
    self.assertIn('| rope | 1 | 50.0 |', one)
    self.assertNotIn('±', one.split('\n', 3)[-1].replace('mean ± std', ''))
    self.assertNotIn('hard cases', one)

  def test_old_results_csv_reads_without_the_hard_column(self):
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, 'results.csv')
    fields = [f for f in result_files.FIELDS if f != result_files.HARD]
    with open(path, 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=fields)
      writer.writeheader()
      writer.writerow({k: v for k, v in _row(0, 1, 1.0).items() if k in fields})
    self.assertIsNone(result_files.read_rows(path)[0][result_files.HARD])
    result_files.write_rows(path, [_row(0, 1, 1.0, 0.5)])
    self.assertEqual(result_files.read_rows(path)[0][result_files.HARD], 0.5)

  def test_runs_singular_and_k_as_int(self):
    text = '\n'.join(results.coverage_summary(['copy/rope/seed0'], [], []))
    self.assertIn('cover 1 run,', text)
    self.assertIn('cover 2 runs,', '\n'.join(results.coverage_summary(['a', 'b'], [], [])))
    base = dict(task='copy', encoding='rope', seed=0, length=4, exact=1.0, drift=0.0,
                **{'early EOS': 0.0, 'missed EOS': 0.0}, ceiling_3=1.0, ceiling_4=1.0)
    none = results.failures_markdown([dict(base, ambiguity=0.0, mean_k_ambiguity=0.0)], 2)
    self.assertIn('| 0.0 | 0.0 | 0.0 | 0.0 | — |', none)
    some = results.failures_markdown([dict(base, ambiguity=0.5, mean_k_ambiguity=3.0)], 2)
    self.assertIn('| 3 | 100.0 | 100.0 |', some)

  def test_hard_column_joins_results_and_diverged_left_out(self):
    hard_rows = [dict(task='copy', encoding='rope', seed=s, length=1, case=c, count=k,
                      exact_match=e)
                 for s, c, k, e in ((0, 'one symbol', 2, 1.0), (0, 'two symbols', 2, 0.5),
                                    (1, 'one symbol', 2, 0.0), (1, 'two symbols', 2, 0.0))]
    joined = hard_report.with_hard([_row(0, 1, 1.0), _row(1, 1, 1.0, diverged_at=3),
                                    _row(0, 2, 1.0)], hard_rows)
    self.assertEqual([r[result_files.HARD] for r in joined], [0.75, 0.0, None])
    text = hard_report.hard_markdown(hard_rows, joined)
    self.assertIn('| rope | 0 of 1 (1 diverged, left out) | 75.0 |', text)
    self.assertIn('| rope | 1/1 | 0/1 |', text)


def _tiny_addition(**study):
  from configs import addition as addition_config  # pylint: disable=import-outside-toplevel
  c = addition_config.get_config('scale=tiny')
  c.study.update(encodings=('rope:coupled',), seeds=(0,), parallel_setups=1, **study)
  return c


class EnsureTest(absltest.TestCase):

  def test_hard_ensure_scores_once_and_again_when_lengths_change(self):
    from attention_jax.lab.runs import plan  # pylint: disable=import-outside-toplevel
    config = plan.run_configs(_tiny_addition())[0]
    run_dir = tempfile.mkdtemp()
    loads = []
    load = lambda c, d: loads.append(d) or resolve(c).build_model(0)
    self.assertFalse(hard.is_current(run_dir, config))
    self.assertTrue(hard.ensure(run_dir, config, load))
    rows = hard.read_hard(hard.run_hard_path(run_dir))
    self.assertEqual({(r['length'], r['case']) for r in rows},
                     {(n, c) for n in eval_lengths(config)
                      for c, _ in hard_cases.addition_cases(n)})
    self.assertEqual({r['encoding'] for r in rows}, {'rope:coupled'})
    self.assertFalse(hard.ensure(run_dir, config, load))  # current: not scored again
    self.assertLen(loads, 1)
    config.eval.lengths = (1, 2)
    self.assertFalse(hard.is_current(run_dir, config))
    self.assertEqual(tasks.get_task('parity_check').hard_set, '')  # no hard set


@pytest.mark.slow
class OlderWorkdirTest(absltest.TestCase):
  """A finished study whose runs have no hard.csv (as older code wrote
  them) gets its hard scores on a rerun of the same command: no training,
  the runs' results.csv untouched."""

  def test_rerun_scores_hard_set_without_training(self):
    from attention_jax.lab.runs.study import run_study  # pylint: disable=import-outside-toplevel
    workdir = tempfile.mkdtemp()
    c = _tiny_addition()
    run_study(c, workdir, log=lambda m: None)
    run_dir = os.path.join(workdir, 'addition', 'rope:coupled', 'seed0')
    fresh = hard.read_hard(hard.run_hard_path(run_dir))
    # Made older: no hard.csv, results.csv without the column.
    os.remove(hard.run_hard_path(run_dir))
    path = os.path.join(run_dir, 'results.csv')
    with open(path, newline='') as f:
      old = [{k: v for k, v in r.items() if k != result_files.HARD} for r in csv.DictReader(f)]
    with open(path, 'w', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=list(old[0]), lineterminator='\n')
      writer.writeheader()
      writer.writerows(old)
    before = {name: os.path.getmtime(os.path.join(run_dir, name))
              for name in ('results.csv', 'run.json', 'metrics.jsonl')}
    logged = []
    rows = run_study(c, workdir, log=logged.append)
    self.assertTrue(any('scoring it from the final checkpoint (no training)' in m
                        for m in logged), logged)
    self.assertEqual(before, {name: os.path.getmtime(os.path.join(run_dir, name))
                              for name in before})
    self.assertEqual(hard.read_hard(hard.run_hard_path(run_dir)), fresh)
    top = result_files.read_rows(os.path.join(workdir, 'results.csv'))
    self.assertTrue(all(r[result_files.HARD] is not None for r in top))
    self.assertEqual([r[result_files.HARD] for r in rows], [r[result_files.HARD] for r in top])
    with open(os.path.join(workdir, 'summary.md')) as f:
      self.assertIn('### addition: hard cases, per seed', f.read())
    logged.clear()
    run_study(c, workdir, log=logged.append)  # now current: nothing scored again
    self.assertFalse(any('hard evaluation set' in m for m in logged), logged)


class ChomskyCasesTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(hard_cases.CHOMSKY))
  def test_chomsky_hard_labels_are_the_official_rule(self, name):
    from attention_jax.lab.evaluate import suite_hard as suite_hard  # pylint: disable=import-outside-toplevel
    spec = tasks.get_spec(name)
    for n in (1, 5, 9):
      x, y = spec.sample(jax.random.key(n), n, 16, 12)
      np.testing.assert_array_equal(suite_hard.LABELS[name](x, n), y)

  def test_chomsky_hard_cases_as_named(self):
    from attention_jax.lab.evaluate import suite_hard  # pylint: disable=import-outside-toplevel
    from attention_jax.lab.protocols import encoder_layout  # pylint: disable=import-outside-toplevel
    parity = tasks.get_spec('parity_check')
    found = hard_cases.chomsky_cases(parity, 7)
    self.assertIn(('one symbol', [1] * 7), found)
    self.assertIn(('alternating', [0, 1, 0, 1, 0, 1, 0]), found)
    buckets = hard_cases.chomsky_cases(tasks.get_spec('bucket_sort'), 10)
    self.assertEqual([x for c, x in buckets if c == 'one symbol'],
                     [[s] * 10 for s in range(5)])
    self.assertEqual([x for c, x in buckets if c == 'sorted'],
                     [[0, 0, 1, 1, 2, 2, 3, 3, 4, 4]])
    self.assertEqual([x for c, x in buckets if c == 'sorted descending'],
                     [[4, 4, 3, 3, 2, 2, 1, 1, 0, 0]])
    cycle = hard_cases.chomsky_cases(tasks.get_spec('cycle_navigation'), 4)
    self.assertEqual([x for _, x in cycle], [[0] * 4, [1] * 4, [2] * 4])
    self.assertEqual(hard_cases.chomsky_cases(tasks.get_spec('stack_manipulation'), 4), [])
    # The layout holds the official labels: parity of n ones is n % 2.
    batch = encoder_layout.encoder_batch(suite_hard.fixed_spec(parity, [x for _, x in found]),
                                         jax.random.key(0), 7, batch_size=len(found), max_length=8)
    targets = np.asarray(batch['targets'])[np.asarray(batch['output_mask'])]
    self.assertEqual([int(t) for t in targets], [sum(x) % 2 for _, x in found])


class SuiteTablesTest(absltest.TestCase):

  def _record(self, scores, diverged_at):
    from attention_jax.lab.protocols import encoder  # pylint: disable=import-outside-toplevel
    per_seed = [dict(score_official=x, score_plain=x, in_range=x) for x in scores]
    record = dict(task='parity_check', level='regular', encoding='alibi', learning_rate=1e-3,
                  seeds=list(range(len(scores))), per_seed=per_seed,
                  scores=encoder.setting_scores(per_seed, diverged_at),
                  train_accuracy=[0.5], diverged_at=diverged_at)
    for name in ('score_official', 'score_plain', 'in_range'):  # a record of older code
      del record['scores'][name]['min']
    return record

  def test_suite_cells_show_worst_seed_and_one_seed_alone(self):
    from attention_jax.lab.report import suite_report  # pylint: disable=import-outside-toplevel
    key = ('parity_check', 'alibi')
    three = suite_report.combine([self._record([0.6, 0.9, 0.1], [None, None, 5])])[key]
    self.assertEqual(suite_report.spread(three['score_official']), '75.0 ± 15.0, worst 60.0')
    one = suite_report.combine([self._record([0.4], [None])])[key]
    self.assertEqual(suite_report.spread(one['score_official']), '40.0')
    # Records of older code have no hard scores: the table says so.
    self.assertIn('| parity_check | alibi | – | – | – |',
                  '\n'.join(suite_report.hard_table({key: one}, ['parity_check'], ['alibi'])))
    record = self._record([1.0, 0.5], [None, None])
    record['hard'] = [[dict(length=3, case='one symbol', count=2, exact_match=1.0)],
                      [dict(length=3, case='one symbol', count=2, exact_match=0.5),
                       dict(length=3, case='alternating', count=1, exact_match=1.0)]]
    table = '\n'.join(suite_report.hard_table(suite_report.combine([record]), ['parity_check'], ['alibi']))
    self.assertIn('| parity_check | alibi | 1 of 2 | 83.3 ± 16.7, worst 66.7 | one symbol |',
                  table)


if __name__ == '__main__':
  absltest.main()
