"""Named model variants in a study (study.variants) and the study's ceiling outputs."""

import csv
import os
import tempfile

import chex
from absl.testing import absltest
import pytest

from attention_jax.lab.config import facts
from attention_jax.lab.runs.plan import place
from attention_jax.lab.runs.plan import run_configs
from attention_jax.lab.config.entries import run_label
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from attention_jax.lab.config.resolved import resolve
from configs import copy as copy_config


def _tiny_with_variant(**variant_model):
  c = copy_config.get_config('scale=tiny')
  c.study.encodings = ('alibi', 'wide')
  c.study.variants.wide = dict(model=dict(encoding='hard_alibi', num_heads=4, **variant_model),
                               train=dict(num_steps=4))
  c.task.train_max_length = 3
  c.eval.update(max_length=6, lengths=(2, 3, 6))
  return c


class StudyVariantsTest(chex.TestCase):

  def test_a_variant_entry_replaces_its_fields_and_names_its_runs(self):
    c = _tiny_with_variant(encoding_options=dict(hard_alibi=dict(widths=(1, 1),
                                                                 offsets=(1, 2))))
    plain, variant = run_configs(c)
    self.assertEqual((run_label(plain), plain.model.num_heads, plain.train.num_steps),
                     ('alibi', 2, 5))
    self.assertEqual((run_label(variant), variant.model.encoding, variant.model.num_heads,
                      variant.train.num_steps), ('wide', 'hard_alibi', 4, 4))
    self.assertEqual(tuple(variant.model.encoding_options.hard_alibi.offsets), (1, 2))
    self.assertEqual(place(variant), os.path.join('copy', 'wide', 'seed0'))
    # The variant's model is what its runs build.
    model = resolve(variant).build_model(0)
    self.assertEqual(model.blocks[0].attention.positional.offsets, (1, 2))

  def test_a_variant_with_an_unknown_field_is_refused_naming_it(self):
    c = _tiny_with_variant(num_hedas=4)
    with self.assertRaisesRegex(ConfigError, r'study\.variants\.wide\.model\.num_hedas: the '
                                             r'config has no such field'):
      validate_config(c, study=True)

  def test_the_presets_variants_are_one_run_or_a_study_entry(self):
    for name, encoding, heads, width, lr in (('mta_lookup', 'mta', 4, 64, 3e-3),
                                             ('ngram_lookup', 'hard_alibi', 5, 160, 1e-3)):
      one = copy_config.get_config(f'encoding={name}')
      validate_config(one)
      validate_config(one, study=True)
      self.assertEqual((one.model.encoding, one.model.variant, one.model.num_heads,
                        one.model.d_model, one.train.learning_rate),
                       (encoding, name, heads, width, lr))
    default = copy_config.get_config()
    self.assertIn('mta_lookup', default.study.encodings)
    run = next(r for r in run_configs(default) if run_label(r) == 'mta_lookup')
    one = facts.resolve_options(copy_config.get_config('encoding=mta_lookup'))
    self.assertEqual(run.model.to_dict(), one.model.to_dict())  # the same model either way
    self.assertEqual(run.train.to_dict(), one.train.to_dict())
    self.assertEqual((run.model.encoding_options.mta.pad_key, run.model.num_layers), ('left', 1))

  def test_a_variant_preset_with_other_entries_is_refused(self):
    # `:encoding=mta_lookup` makes the base config that variant: another entry
    # would start from it (one layer, its kernel) instead of the default model.
    c = copy_config.get_config('encoding=mta_lookup')
    c.study.encodings = ('mta_lookup', 'ngram_lookup')
    with self.assertRaisesRegex(ConfigError, r"model.variant='mta_lookup' .* sweep them "
                                             r'from the plain preset'):
      validate_config(c, study=True)

  @pytest.mark.slow
  def test_a_study_with_a_variant_writes_its_rows_and_the_ceiling(self):
    workdir = tempfile.mkdtemp()
    rows = run_study(_tiny_with_variant(), workdir, log=lambda _: None)
    self.assertEqual({r['encoding'] for r in rows}, {'alibi', 'wide'})
    with open(os.path.join(workdir, 'ceiling.csv'), newline='') as f:
      ceiling = list(csv.DictReader(f))
    self.assertEqual({(r['task'], int(r['length'])) for r in ceiling},
                     {('copy', n) for n in (2, 3, 6)})
    self.assertEqual(sorted({int(r['k']) for r in ceiling}), [1, 2, 3, 4, 5, 6])
    at = {(int(r['length']), int(r['k'])): float(r['unambiguous']) for r in ceiling}
    self.assertEqual(at[(2, 6)], 1.0)  # a 2-symbol string repeats no 6-gram
    self.assertLess(at[(6, 1)], at[(6, 3)])  # longer contexts disambiguate more
    with open(os.path.join(workdir, 'summary.md')) as f:
      summary = f.read()
    self.assertIn("The task's own ceiling", summary)
    self.assertIn('| wide | 1 |', summary)
    # A later sweep of another entry on the same workdir keeps the variant's rows.
    later = _tiny_with_variant()
    later.study.encodings = ('alibi',)
    rows = run_study(later, workdir, log=lambda _: None)
    self.assertEqual({r['encoding'] for r in rows}, {'alibi', 'wide'})


if __name__ == '__main__':
  absltest.main()
