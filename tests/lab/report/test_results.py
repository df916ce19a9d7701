"""What a reader of a run's printed tables and a study's figure sees: every
table and every line says which encoding (and variant) and how many seeds."""

import os
import tempfile
from unittest import mock

import matplotlib.figure
from absl.testing import absltest

from attention_jax.lab.report import plots
from attention_jax.lab.report import results


def _rows(labels, seeds=(0,), lengths=(4, 8)):
  return [dict(task='copy', encoding=label, seed=seed, length=n, token_accuracy=0.5,
               exact_match=0.25)
          for label in labels for seed in seeds for n in lengths]


class RunTableTest(absltest.TestCase):

  def test_each_variant_is_a_table_headed_by_its_label(self):
    text = results.run_table(_rows(('rope', 'rope+pi', 'rope+yarn')))
    blocks = text.split('\n\n')
    self.assertLen(blocks, 3)
    for block, label in zip(blocks, ('rope', 'rope+pi', 'rope+yarn')):
      lines = block.splitlines()
      self.assertEqual(lines[0], f'{label} (copy, seed 0):')
      self.assertEqual(lines[1].split(), ['length', 'token', 'acc', 'exact'])
      self.assertEqual([line.split()[0] for line in lines[2:]], ['4', '8'])
    self.assertIn('50.0%', text)
    self.assertIn('25.0%', text)


class LegendTest(absltest.TestCase):

  def _legend(self, rows):
    seen = []
    original = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
      seen.extend(t.get_text() for ax in fig.axes if ax.get_legend()
                  for t in ax.get_legend().get_texts())
      return original(fig, *args, **kwargs)

    path = os.path.join(tempfile.mkdtemp(), 'extrapolation.png')
    with mock.patch.object(matplotlib.figure.Figure, 'savefig', keep):
      plots.plot_extrapolation(rows, path, train_min=1, train_max=4)
    self.assertTrue(os.path.exists(path))
    return seen

  def test_seed_counts_in_the_legend(self):
    legend = self._legend(_rows(('alibi',)) + _rows(('rope',), seeds=(0, 1)))
    self.assertIn('alibi (1 seed)', legend)
    self.assertIn('rope (2 seeds)', legend)


if __name__ == '__main__':
  absltest.main()
