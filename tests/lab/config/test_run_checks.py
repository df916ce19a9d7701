"""Validation's second step: each run the config asks for is resolved into
its record and checked on the record's facts (`config.run_checks`), so a
check concerns the run it names, and a bad value of a task's reads once as
that task's."""

from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.config.resolved import resolve
from attention_jax.lab.config.validate import checked_run
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.errors import ConfigError
from tests.lab.configs import with_fields
from configs import copy as copy_config


def _tiny(**fields):
  return with_fields(copy_config.get_config('scale=tiny'), **fields)


class RunChecksTest(parameterized.TestCase):

  def test_one_record_per_task_kind_and_entry(self):
    c = _tiny(study__tasks=('copy', 'reverse'), study__models=('transformer', 'seq2seq'),
              study__encodings=('rope', 'alibi:randomized'))
    records = validate_config(c, study=True)
    self.assertEqual([(r.task.name, r.config.model.kind, r.encoding,
                       bool(r.randomized_max_position)) for r in records],
                     [('copy', 'transformer', 'rope', False),
                      ('copy', 'transformer', 'alibi', True),
                      ('copy', 'seq2seq', '', False),
                      ('reverse', 'transformer', 'rope', False),
                      ('reverse', 'transformer', 'alibi', True),
                      ('reverse', 'seq2seq', '', False)])

  def test_a_checked_run_is_its_record(self):
    c = _tiny(model__encoding='rope:randomized')
    run, again = checked_run(c), resolve(c)
    self.assertEqual(run.config.to_dict(), again.config.to_dict())
    self.assertEqual((run.longest_sequence, run.randomized_max_position, run.eval_lengths),
                     (again.longest_sequence, again.randomized_max_position,
                      again.eval_lengths))

  def test_a_learned_table_is_checked_against_its_own_entry_only(self):
    # The table holds every position a plain 'learned' run reads; another
    # entry's randomized range is not its concern.
    longest = resolve(_tiny(model__encoding='learned')).longest_sequence
    c = _tiny(study__encodings=('learned', 'rope:randomized'), model__max_positions=longest)
    self.assertLen(validate_config(c, study=True), 2)
    c.study.encodings = ('learned:randomized',)
    with self.assertRaisesRegex(ConfigError, rf'model.max_positions={longest} is shorter than '
                                r'the randomized range \[0, \d+\) of a learned table'):
      validate_config(c, study=True)

  def test_layer_indices_as_the_command_line_gives_them(self):
    # The field holds a string (a pattern, or None): '(0,)' and '0,1' are indices.
    for text, layers in (('(0,)', (0,)), ('0,1', (0, 1)), (' (1, 0) ', (1, 0))):
      run = checked_run(_tiny(model__num_layers=2, model__encoding_layers=text))
      self.assertEqual(run.model_arguments['encoding_layers'], layers)
    self.assertEqual(checked_run(_tiny(model__num_layers=2, model__encoding_layers='rope/4,none')
                                 ).model_arguments['encoding_layers'], 'rope/4,none')
    with self.assertRaisesRegex(ConfigError, r'model.encoding_layers=\(5,\) must be distinct '
                                r'layer indices in 0 … 1'):
      checked_run(_tiny(model__num_layers=2, model__encoding_layers='(5,)'))

  @parameterized.named_parameters(
      ('pack', dict(task__pack=0), r'task.pack=0 must be an integer >= 1'),
      ('pack_segments', dict(task__pack_segments=-1), r'task.pack_segments=-1 must be'),
      ('both_packings', dict(task__pack=2, task__pack_segments=2),
       r'task.pack_segments=2 and task.pack=2 do not combine'),
      ('evaluation_task_layout', dict(eval__tasks=('duplicate',)),
       r"eval.tasks has 'duplicate', whose tokens or sequence lengths differ"),
      # The evaluation task's own refusal names it, not the trained task alone.
      ('evaluation_task_options', dict(eval__tasks=('flipflop',)),
       r"eval.tasks has 'flipflop': task.train_min_length=1: a flip-flop sequence"),
      ('evaluation_task_name', dict(eval__tasks=('nosuch',)),
       r"eval.tasks has 'nosuch': unknown task 'nosuch'; choose one of \['addition'"),
  )
  def test_a_bad_task_value_names_the_task_once(self, fields, message):
    for study in (False, True):
      with self.subTest(study=study):
        with self.assertRaisesRegex(ConfigError, message) as caught:
          validate_config(_tiny(**fields), study=study)
        text = str(caught.exception)
        self.assertTrue(text.startswith("invalid config: task 'copy': "), text)
        self.assertEqual(text.count('invalid config'), 1, text)


if __name__ == '__main__':
  absltest.main()
