"""Attention entropy and the diagnostics figures."""

import csv
import os
import tempfile

import numpy as np
from absl.testing import absltest
import pytest

from attention_jax.lab.runs.diagnose import run_diagnostics
from attention_jax.lab.runs.plan import run_configs
from attention_jax.lab.runs.plan import place
from attention_jax.lab.train import train
from attention_jax.lab.evaluate import attention_entropy
from configs import copy as copy_config


class EntropyTest(absltest.TestCase):

  def test_uniform_is_log_k_and_one_hot_is_zero(self):
    w = np.zeros((2, 4, 4))
    w[0] = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]  # uniform over keys 0…i
    w[1, :, 0] = 1.0
    np.testing.assert_allclose(attention_entropy(w)[0], np.log(np.arange(1, 5)), atol=1e-12)
    np.testing.assert_allclose(attention_entropy(w)[1], 0.0, atol=1e-12)


class DiagnosticsTest(absltest.TestCase):

  @pytest.mark.slow
  def test_tiny_study_figures(self):
    c = copy_config.get_config('scale=tiny')
    c.study.encodings = ('alibi', 'rope:randomized')
    c.study.seeds = (0, 1)
    workdir = tempfile.mkdtemp()
    for run in run_configs(c):  # the study's models (diagnostics never train)
      train(run, os.path.join(workdir, place(run)), progress=False)
    curves = run_diagnostics(c, workdir, num_examples=4, log=lambda _: None)
    self.assertEqual(list(curves), ['alibi', 'rope:randomized'])
    self.assertEqual(curves['alibi'].shape, (2 * 8 + 2,))  # tokens read at 4 × L_train = 8
    for name in ('attention_entropy.png', 'attention_maps_alibi.png',
                 'attention_maps_rope_randomized.png'):
      self.assertGreater(os.path.getsize(os.path.join(workdir, name)), 0, name)
    # The maps are the first seed's; the failures every seed's.
    with open(os.path.join(workdir, 'failures.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual(sorted({(r['encoding'], r['seed']) for r in rows}),
                     [('alibi', '0'), ('alibi', '1'), ('rope:randomized', '0'),
                      ('rope:randomized', '1')])
    # Restored from the final checkpoints: the same curves every time.
    again = run_diagnostics(c, workdir, num_examples=4, log=lambda _: None)
    np.testing.assert_allclose(again['alibi'], curves['alibi'])


if __name__ == '__main__':
  absltest.main()
