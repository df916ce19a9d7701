"""DeepMind's suite's config (`lab.config.suite_config`): every bad value
refused before anything runs, naming the field; the workdir's identity, a
damaged config.json, the fields renamed since a workdir was written."""

import json
import os
import re
import tempfile

import chex
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.config import command_line
from attention_jax.lab.config import suite_config
from attention_jax.lab.config.renamed import RENAMED
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.tasks.chomsky import registry
from configs import chomsky as chomsky_config
from tests.lab.runs.test_suite import tiny


class ConfigTest(chex.TestCase):

  def test_a_workdir_of_the_older_field_names_is_read_with_todays(self):
    # The suite once named the training range train.min_length/max_length
    # and the randomized range model.noise_max_length; the study's names now.
    workdir = tempfile.mkdtemp()
    stored = suite_config.identity(tiny())
    stored['train'].update(min_length=stored['task'].pop('train_min_length'),
                           max_length=stored['task'].pop('train_max_length'))
    stored['model']['noise_max_length'] = stored.pop('positions')['max_position']
    del stored['task']
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump(dict(identity=stored), f)
    suite_config.check_workdir(tiny(), workdir)  # the same config: accepted
    for old, new in RENAMED.items():  # an older flag names today's field
      with self.assertRaisesRegex(ConfigError, re.escape(f"it is {'.'.join(new)} now")):
        command_line._check_path(tiny(), '.'.join(old))
    with self.assertRaisesRegex(ConfigError, r'another config \(differing: '
                                r'positions.max_position, task.train_max_length\)'):
      suite_config.check_workdir(tiny(**{'task.train_max_length': 3,
                                         'positions.max_position': 32}), workdir)

  @parameterized.named_parameters(
      ('not_json', '{"identity": '), ('no_identity', '{"config": {}}'),
      ('identity_not_a_mapping', '{"identity": [1, 2]}'), ('not_an_object', '[1]'))
  def test_a_damaged_workdir_config_is_named_and_left_as_it_is(self, text):
    workdir = tempfile.mkdtemp()
    path = os.path.join(workdir, 'config.json')
    with open(path, 'w') as f:
      f.write(text)
    with self.assertRaisesRegex(ConfigError, f'^{re.escape(path)} is damaged .*another --workdir'):
      suite_config.check_workdir(tiny(), workdir)
    with open(path) as f:
      self.assertEqual(f.read(), text)

  def test_unknown_task_lists_the_known_ones(self):
    with self.assertRaisesRegex(ConfigError, "unknown task 'parity'.*even_pairs"):
      suite_config.validate(tiny(**{'study.tasks': ('parity',)}))

  def test_causal_only_encodings_refused_with_the_reason(self):
    for spec in ('fox', 'xpos'):
      with self.assertRaisesRegex(ConfigError, f"encoding '{spec}' cannot run the "
                                  'bidirectional encoder protocol: .*causal'):
        suite_config.validate(tiny(**{'study.encodings': (spec,)}))

  def test_randomized_only_where_their_code_defines_it(self):
    with self.assertRaisesRegex(ConfigError, "'kerple:randomized'.*alibi"):
      suite_config.validate(tiny(**{'study.encodings': ('kerple:randomized',)}))

  def test_coupled_duplicates_and_empty_lists_refused(self):
    with self.assertRaisesRegex(ConfigError, "'rope:coupled': the encoder protocol takes NAME "
                                'or NAME:randomized'):
      suite_config.validate(tiny(**{'study.encodings': ('rope:coupled',)}))
    with self.assertRaisesRegex(ConfigError, r"study.tasks names \['copy'\] more than once"):
      suite_config.validate(tiny(**{'study.tasks': ('copy', 'copy')}))
    with self.assertRaisesRegex(ConfigError,
                                r"study.encodings names \['rope'\] more than once"):
      suite_config.validate(tiny(**{'study.encodings': ('rope', 'rope')}))
    with self.assertRaisesRegex(ValueError, r"argument 'tasks=': tasks= is empty"):
      chomsky_config.get_config('scale=tiny,tasks=')

  def test_eval_range_must_reach_past_the_first_test_length(self):
    with self.assertRaisesRegex(ConfigError, 'eval.max_length=5 must be >= '):
      suite_config.validate(tiny(**{'eval.max_length': 5}))

  def test_model_sizes_and_noise_range_checked(self):
    with self.assertRaisesRegex(ConfigError, 'model.d_model=15 must be an even integer'):
      suite_config.validate(tiny(**{'model.d_model': 15}))
    with self.assertRaisesRegex(ConfigError, 'positions.max_position=8 is below the longest'):
      suite_config.validate(tiny(**{'positions.max_position': 8}))
    suite_config.validate(tiny(**{'study.encodings': ('alibi',),  # not randomized
                                  'positions.max_position': 8}))
    for bad in (0, -3):
      with self.assertRaisesRegex(ConfigError, f'positions.max_position={bad!r} must be an '
                                  'integer >= 1'):
        suite_config.validate(tiny(**{'positions.max_position': bad}))
    with self.assertRaisesRegex(ConfigError, 'task.train_min_length=5 > task.train_max_length=4'):
      suite_config.validate(tiny(**{'task.train_min_length': 5}))

  def test_job_fields_checked(self):
    for path, value, message in (
        ('train.checkpoint_every', 3, r'train.checkpoint_every=3 must be a multiple of '
                                      r'train.steps_per_call=2'),
        ('train.stop_after', 1, r'train.stop_after=1 must be 0 \(never\) or a multiple'),
        ('train.max_minutes', -1.0, r'train.max_minutes=-1.0 must be a finite number'),
        ('study.on_locked', 'skip', r"study.on_locked='skip'; choose 'refuse' or 'wait'"),
        ('study.shard', (2, 2), r'study.shard=\(2, 2\) must be \(INDEX, COUNT\)'),
        ('study.parallel_setups', 0, r'study.parallel_setups=0 must be an integer >= 1'),
        ('train.num_steps', 0, r'train.num_steps=0 must be an integer >= 1')):
      with self.assertRaisesRegex(ConfigError, message):
        suite_config.validate(tiny(**{path: value}))

  def test_job_fields_may_change_between_invocations(self):
    a = suite_config.identity(tiny())
    b = suite_config.identity(tiny(**{'train.stop_after': 2, 'train.max_minutes': 5.0,
                               'study.shard': (0, 2), 'train.checkpoint_every': 4,
                               'study.tasks': ('parity_check',), 'study.parallel_setups': 1}))
    self.assertEqual(a, b)
    self.assertNotEqual(a, suite_config.identity(tiny(**{'study.seeds': (0,)})))

  def test_bad_preset_argument_named(self):
    with self.assertRaisesRegex(ValueError, "scale='huge'"):
      chomsky_config.get_config('scale=huge')

  def test_every_task_registered_in_the_papers_order(self):
    self.assertEqual(tuple(registry.TASKS), chomsky_config.TASKS)
    levels = [t.level for t in registry.TASKS.values()]
    self.assertEqual(levels, sorted(levels, key=('regular', 'context_free',
                                                 'context_sensitive').index))


if __name__ == '__main__':
  absltest.main()
