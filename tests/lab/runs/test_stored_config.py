"""The follow-up tools take a study workdir's config from a plain entry's
run, never from a variant's or a part's, whichever finished last."""

import os
import tempfile
import time

from absl.testing import absltest

from attention_jax.lab.runs.diagnose import stored_config
from attention_jax.lab.config.entries import entry_config
from attention_jax.lab.runs.plan import place
from configs import copy as copy_config


def _write_run(workdir, config):
  run_dir = os.path.join(workdir, place(config))
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, 'config.json'), 'w') as f:
    f.write(config.to_json())
  return run_dir


class StoredConfigTest(absltest.TestCase):

  def test_newest_run_of_a_variant_does_not_stand_for_the_study(self):
    workdir = tempfile.mkdtemp()
    study = copy_config.get_config('scale=tiny')  # rope, ..., mta_lookup (1 layer, 3,000 steps)
    study.study.variants.mta_lookup.train = dict(num_steps=3000)
    plain = _write_run(workdir, entry_config(study, 'rope'))
    for i, entry in enumerate(('windowed_rope:coupled', 'mta_lookup')):
      run_dir = _write_run(workdir, entry_config(study, entry))
      stamp = time.time() + 10 * (i + 1)  # newer than the plain run
      os.utime(os.path.join(run_dir, 'config.json'), (stamp, stamp))
    os.utime(os.path.join(plain, 'config.json'), (1, 1))
    found = stored_config(workdir)
    self.assertEqual(found.model.get('variant'), '')
    self.assertEqual(found.model.num_layers, study.model.num_layers)
    self.assertEqual(found.train.num_steps, study.train.num_steps)
    self.assertEqual(tuple(found.study.encodings), tuple(study.study.encodings))

  def test_a_study_of_variants_only_still_has_a_config(self):
    workdir = tempfile.mkdtemp()
    _write_run(workdir, entry_config(copy_config.get_config('scale=tiny'), 'mta_lookup'))
    self.assertEqual(stored_config(workdir).model.variant, 'mta_lookup')


if __name__ == '__main__':
  absltest.main()
