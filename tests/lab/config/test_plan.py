"""A study's plan: one grammar for its entries (`lab.config.entries`), one record
per run (`lab.runs.plan.Run`), resolved options, the run directory layout, and
the presets that choose the scale and the study."""

import json
import os
import tempfile

import chex
from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab.config import entries
from attention_jax.lab.config import identity
from attention_jax.lab.config import facts
from attention_jax.lab.runs import plan
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from configs import copy as copy_config


def _tiny(*encodings):
  c = copy_config.get_config('scale=tiny')
  c.study.encodings = encodings
  return c


class EntryGrammarTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('encoding', 'rope', 'rope', 'softmax', ''),
      ('modifier', 'rope:coupled', 'rope:coupled', 'softmax', ''),
      ('normalization', 'none:stick_breaking', 'none', 'stick_breaking', ''),
      ('two_parts', 'alibi:randomized:stick_breaking', 'alibi:randomized', 'stick_breaking', ''),
      ('variant', 'mta_lookup', 'mta', 'softmax', 'mta_lookup'),
      ('variant_and_part', 'mta_lookup:stick_breaking', 'mta', 'stick_breaking',
       'mta_lookup:stick_breaking'),
  )
  def test_an_entry_is_a_base_and_parts(self, entry, encoding, normalization, variant):
    config = copy_config.get_config('scale=tiny')
    config.lock()  # as config_flags hands it to the entry point
    c = entries.entry_config(config, entry)
    self.assertEqual((c.model.encoding, c.model.normalization, c.model.variant),
                     (encoding, normalization, variant))
    self.assertEqual(entries.run_label(c), entry)  # the label is the entry
    self.assertTrue(config.is_locked)  # the caller's config is left as it was

  @parameterized.named_parameters(
      ('older_plus', 'none+stick_breaking', r"parts follow a colon, e.g. 'none:stick_breaking'"),
      ('unknown_part', 'rope:warped', r"no part 'warped'; the parts are coupled, mta_lookup"),
      ('unknown_base', 'ropee', r"'ropee' is neither an encoding \(alibi, .*\) nor a variant "
                                r'\(mta_lookup, ngram_lookup, rnope_swa\)'),
      ('empty', '', r'must be a non-empty string'),
  )
  def test_a_bad_entry_is_refused_naming_it(self, entry, message):
    with self.assertRaisesRegex(ValueError, message):
      entries.entry_config(copy_config.get_config('scale=tiny'), entry)
    with self.assertRaisesRegex(ConfigError, r'invalid config: study.encodings: '):
      validate_config(_tiny(entry), study=True)

  def test_a_variant_may_not_take_a_parts_name(self):
    c = _tiny('rope')
    c.study.variants.coupled = dict(model=dict(num_layers=1))
    with self.assertRaisesRegex(ValueError, r'study.variants.coupled: the name of a built-in '
                                            r'part'):
      entries.entry_config(c, 'rope')


class RunRecordTest(chex.TestCase):

  def test_the_plan_has_one_record_per_run_in_sweep_order(self):
    c = _tiny('rope', 'none:stick_breaking')
    c.study.seeds = (0, 1)
    workdir = tempfile.mkdtemp()
    runs = plan.plan_study(c, workdir)
    self.assertEqual([(r.number, r.place) for r in runs],
                     [(1, 'copy/rope/seed0'), (2, 'copy/rope/seed1'),
                      (3, 'copy/none:stick_breaking/seed0'),
                      (4, 'copy/none:stick_breaking/seed1')])
    self.assertEqual(runs[0].directory, os.path.join(workdir, 'copy', 'rope', 'seed0'))
    self.assertEqual([len(s) for s in plan.setups(runs)], [2, 2])
    self.assertEqual(runs[0].hash(), runs[1].hash())  # seeds of one setup
    self.assertNotEqual(runs[0].hash(), runs[2].hash())
    self.assertEqual(str(runs[2]), 'copy none:stick_breaking seed 0')
    self.assertFalse(os.path.exists(workdir + '/copy'))  # planning creates nothing
    with self.assertRaises(Exception):
      runs[0].number = 5  # a record is frozen

  def test_a_workdir_of_the_older_layout_is_refused_with_the_move(self):
    workdir = tempfile.mkdtemp()
    old = os.path.join(workdir, 'runs', 'copy', 'rope', 'seed0')
    os.makedirs(old)
    with open(os.path.join(old, 'config.json'), 'w') as f:
      json.dump({}, f)
    with self.assertRaisesRegex(ConfigError, r'older layout .*mv .*/runs/\* .*/ && rmdir'):
      plan.plan_study(_tiny('rope'), workdir)


class ResolvedOptionsTest(chex.TestCase):

  def test_options_not_set_take_the_build_defaults(self):
    c = copy_config.get_config('scale=tiny,encoding=fire')
    self.assertNotIn('fire', c.model.encoding_options)  # the config lists choices only
    resolved = facts.resolve_options(c)
    self.assertEqual(resolved.model.encoding_options.fire.to_dict(),
                     dict(mlp_width=32, init_c=0.1, init_threshold=512.0, eps=1e-6))
    c.model.encoding_options.fire = dict(mlp_width=8)
    self.assertEqual(facts.resolve_options(c).model.encoding_options.fire.mlp_width, 8)
    # The lab's own default beside the library's: no host callback for the table.
    learned = facts.resolve_options(copy_config.get_config('scale=tiny,encoding=learned'))
    self.assertFalse(learned.model.encoding_options.learned.check_positions)

  def test_an_older_config_listing_defaults_is_the_same_run(self):
    c = facts.resolve_options(copy_config.get_config('scale=tiny,encoding=fire'))
    older = copy_config.get_config('scale=tiny,encoding=fire')  # no fire group at all
    self.assertEqual(identity.differences(older, c), [])
    c.model.encoding_options.fire.mlp_width = 64
    self.assertEqual(identity.differences(older, c)[0],
                     ('model.encoding_options.fire.mlp_width', 32, 64))


class PresetsTest(parameterized.TestCase):

  def test_the_default_study_is_the_lessons_four_nope_and_the_best_of_each_kind(self):
    c = copy_config.get_config()
    self.assertEqual(tuple(c.study.encodings),
                     ('none', 'sinusoidal', 'learned', 'rope', 'alibi', 'fire',
                      'windowed_rope:coupled', 'mta_lookup'))
    self.assertEqual((tuple(c.study.tasks), c.model.num_layers, c.train.num_steps),
                     (('copy',), 2, 2000))

  @parameterized.parameters(*copy_config.STUDIES)
  def test_every_study_preset_is_valid_at_every_scale(self, study):
    for scale in copy_config.SCALES:
      c = copy_config.get_config(f'scale={scale},study={study}')
      self.assertEqual(tuple(c.study.encodings), copy_config.STUDIES[study]['encodings'])
      validate_config(c, study=True)
      plan.run_configs(c)  # every entry parses

  def test_a_task_narrows_the_studys_tasks(self):
    c = copy_config.get_config('study=frontier,task=reverse')
    self.assertEqual((c.task.name, tuple(c.study.tasks)), ('reverse', ('reverse',)))


if __name__ == '__main__':
  absltest.main()
