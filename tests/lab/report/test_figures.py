"""What a reader of each figure the lab writes sees, read from the matplotlib
objects the plot functions return: axis limits that follow the evaluated
lengths, entries never drawn in the reference lines' grey, colorbars labelled
and in the tables' unit, the addition grid's training box on cell edges, and
no text cut at the figure's border. Tiny synthetic results, no training."""

import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import matplotlib.colors
import matplotlib.patches
from matplotlib.backends.backend_agg import FigureCanvasAgg
import numpy as np

from attention_jax.lab.report import plots
from attention_jax.lab.report import result_files
from attention_jax.lab.runs import workdirs
from attention_jax.lab.report import suite_report
from configs import chomsky as chomsky_config

plots_extrapolation = plots.plot_extrapolation  # the real one, under a patch

# Text may touch the border by antialiasing, not by more.
_PIXEL = 1.0


def _path(name):
  return os.path.join(tempfile.mkdtemp(), name)


def _extrapolation_rows(labels, lengths=(1, 2, 3, 4, 6, 8), task='copy'):
  return [dict(task=task, encoding=label, seed=0, length=n, token_accuracy=0.5,
               exact_match=0.25) for label in labels for n in lengths]


def _ceilings(lengths=(1, 2, 3, 4, 6, 8, 16, 32), task='copy'):
  return [dict(task=task, length=n, k=k, unambiguous=1.0 - 0.01 * n)
          for n in lengths for k in plots.CEILING_KS]


def _draw(fig):
  """Draws `fig` as it was saved (pyplot's close left it a bare canvas);
  returns the renderer."""
  canvas = FigureCanvasAgg(fig)
  canvas.draw()
  return canvas.get_renderer()


class FigureTestCase(parameterized.TestCase):

  def assert_nothing_cut(self, fig):
    """Every drawn artist (labels, titles, legends, colorbars) lies inside
    the figure: its tight bounding box within the figure's."""
    renderer = _draw(fig)
    tight = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # pixels
    box = fig.bbox
    self.assertGreaterEqual(tight.x0, box.x0 - _PIXEL, 'cut on the left')
    self.assertGreaterEqual(tight.y0, box.y0 - _PIXEL, 'cut at the bottom')
    self.assertLessEqual(tight.x1, box.x1 + _PIXEL, 'cut on the right')
    self.assertLessEqual(tight.y1, box.y1 + _PIXEL, 'cut at the top')

  def assert_text_inside(self, fig, text):
    renderer = _draw(fig)
    extent = text.get_window_extent(renderer)
    box = fig.bbox
    self.assertTrue(extent.x0 >= box.x0 - _PIXEL and extent.x1 <= box.x1 + _PIXEL
                    and extent.y0 >= box.y0 - _PIXEL and extent.y1 <= box.y1 + _PIXEL,
                    f'{text.get_text()!r} at {extent} leaves the figure {box}')

  def colorbar_axes(self, fig):
    """The figure's colorbar axes (`fig.colorbar` makes them)."""
    found = [ax for ax in fig.axes if ax.get_label() == '<colorbar>']
    self.assertLen(found, 1)
    return found[0]


class ExtrapolationFigureTest(FigureTestCase):

  def test_extrapolation_x_axis_stops_at_the_evaluated_lengths(self):
    fig = plots.plot_extrapolation(_extrapolation_rows(('rope', 'alibi')),
                                   _path('extrapolation.png'), train_min=1, train_max=4,
                                   ceilings=_ceilings())
    for ax in fig.axes:
      lo, hi = ax.get_xlim()
      self.assertBetween(lo, 0.5, 1.0)  # a margin under 1, not a power of 2 below it
      self.assertBetween(hi, 8.0, 10.0)  # the 4× and 8× marks (16, 32) are left out
      vertical = [line.get_xdata()[0] for line in ax.get_lines()
                  if len(set(line.get_xdata())) == 1 and line.get_linestyle() == ':']
      self.assertEqual(vertical, [8])  # 2× L_train only
      self.assertEqual(ax.get_xlabel(), 'input length (log scale; dotted: 2× L_train)')
      self.assertEqual([t.get_text() for t in ax.get_xticklabels()],
                       ['1', '2', '3', '4', '6', '8'])
      for line in ax.get_lines():  # ceilings past the last length are not drawn
        self.assertLessEqual(max(line.get_xdata(), default=0), 8)
    self.assert_nothing_cut(fig)

  def test_length_ticks_are_the_evaluated_lengths_or_spaced_powers_of_two(self):
    self.assertEqual(plots.length_ticks([1, 2, 3, 4, 6, 8]), [1, 2, 3, 4, 6, 8])
    cpu = list(range(1, 9)) + [10, 12, 16, 24, 32, 48, 64]  # configs/copy.py's lengths
    self.assertEqual(plots.length_ticks(cpu), [1, 2, 4, 8, 16, 32, 64])
    # 512 past the end; 256 kept, 0.97 octaves from 500.
    self.assertEqual(plots.length_ticks(list(range(1, 41)) + [100, 200, 300, 500]),
                     [1, 2, 4, 8, 16, 32, 64, 128, 256, 500])
    # 32 is 0.17 octaves from 36: its label would overlap; 4 is 0.42 from 3.
    self.assertEqual(plots.length_ticks(list(range(3, 12)) + [36]), [3, 4, 8, 16, 36])

  def test_extrapolation_entry_colours_are_never_a_reference_grey(self):
    labels = [f'entry{i}' for i in range(24)]  # past tab20's grey at i = 7 and 17
    fig = plots.plot_extrapolation(_extrapolation_rows(labels), _path('extrapolation.png'),
                                   train_min=1, train_max=2, ceilings=_ceilings())
    ax = fig.axes[1]  # exact match: entries, ceilings and the L_train marks together
    lines = ax.get_lines()
    entries = [matplotlib.colors.to_rgb(l.get_color()) for l in lines
               if l.get_label().startswith('entry')]
    references = [matplotlib.colors.to_rgb(l.get_color()) for l in lines
                  if not l.get_label().startswith('entry')]
    self.assertLen(entries, len(labels))
    self.assertLen(set(entries), len(labels))  # distinct from each other too
    self.assertNotEmpty([l for l in lines if l.get_label().startswith('ceiling')])
    for colour in entries:
      self.assertNotIn(colour, references)
      self.assertGreater(np.ptp(colour), 0.1, f'{colour} is a grey')
    self.assert_nothing_cut(fig)

  def test_redrawn_study_keeps_its_ceilings(self):
    study = tempfile.mkdtemp()
    rows = [dict(r, generated_exact_match='', generation_agreement='', config_hash='x',
                 version='0', diverged_at='', num_steps=5)
            for r in _extrapolation_rows(('rope',))]
    result_files.write_rows(os.path.join(study, 'results.csv'), rows)
    result_files.write_ceiling(os.path.join(study, 'ceiling.csv'), _ceilings())
    drawn = []
    with mock.patch.object(plots, 'plot_extrapolation',
                           lambda *a, **k: drawn.append(plots_extrapolation(*a, **k))):
      workdirs.redraw([study], tempfile.mkdtemp(), log=lambda _: None)
      workdirs.redraw([study, study + '/'], tempfile.mkdtemp(), log=lambda _: None)
    alone, two = ([l.get_label() for l in fig.axes[1].get_lines()
                   if l.get_label().startswith('ceiling')] for fig in drawn)
    self.assertEqual(alone, [f'ceiling: {k}-gram lookup' for k in plots.CEILING_KS])
    self.assertEmpty(two)  # two studies' ceilings may differ: none drawn

  def test_training_curves_are_inside_the_figure(self):
    curves = {f'copy/entry{i}/seed0': [dict(step=s, loss=1.0 / s, token_accuracy=s / 10)
                                        for s in range(1, 11)] for i in range(9)}
    fig = plots.plot_training_curves(curves, _path('training_curves.png'))
    colours = [matplotlib.colors.to_rgb(l.get_color()) for l in fig.axes[0].get_lines()]
    self.assertLen(set(colours), 9)
    self.assertTrue(all(np.ptp(c) > 0.1 for c in colours))
    self.assert_nothing_cut(fig)


class SuiteFigureTest(FigureTestCase):

  @parameterized.named_parameters(
      ('one_task_one_encoding', chomsky_config.TASKS[:1], ('rope',)),
      ('whole_suite', chomsky_config.TASKS, chomsky_config.ENCODINGS))
  def test_suite_colorbar_label_is_inside_the_figure(self, names, encodings):
    names, encodings = list(names), list(encodings)
    combined = {(n, e): dict(score_official=dict(max=0.5), diverged=[], runs=1)
                for n in names for e in encodings}
    fig = suite_report.figure(combined, names, encodings, _path('chomsky.png'),
                        title='test lengths 6–8 after training on 1–4')
    bar = self.colorbar_axes(fig)
    label = bar.yaxis.label
    self.assertIn('%', label.get_text())
    self.assertEqual(bar.get_ylim(), (0.0, 100.0))
    self.assert_text_inside(fig, label)
    self.assert_nothing_cut(fig)


class GridFigureTest(FigureTestCase):

  @parameterized.named_parameters(
      ('tiny_preset', (1, 6), 3),
      ('three_sizes', (1, 2, 4), 2),
      ('cpu_preset', (1, 5, 10, 20, 30, 40), 10),
      ('none_in_range', (4, 6), 3))
  def test_grid_in_percent_with_the_box_on_cell_edges(self, sizes, train_max):
    rows = [dict(task='addition', encoding=e, seed=s, digits_a=a, digits_b=b,
                 exact_match=0.25 * (s + 1) * (a <= train_max), token_accuracy=1.0)
            for e in ('rope:coupled', 'none:abacus') for s in (0, 1)
            for a in sizes for b in sizes]
    fig = plots.plot_grid(rows, _path('addition_grid.png'), train_max=train_max)
    bar = self.colorbar_axes(fig)
    self.assertIn('%', bar.yaxis.label.get_text())
    self.assertEqual(bar.get_ylim(), (0.0, 100.0))
    self.assert_text_inside(fig, bar.yaxis.label)
    inside = sum(s <= train_max for s in sizes)
    panels = [ax for ax in fig.axes if ax.images]
    self.assertLen(panels, 2)
    for ax in panels:
      image = ax.images[0]
      self.assertEqual(image.get_clim(), (0, 100))
      values = np.asarray(image.get_array())
      self.assertAlmostEqual(values.max(), 37.5 if inside else 0.0)  # mean of 25 and 50, in %
      edges = (-0.5, len(sizes) - 0.5)
      self.assertEqual(ax.get_xlim(), edges)
      self.assertEqual(ax.get_ylim(), edges)
      boxes = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
      if not inside:
        self.assertEmpty(boxes)
        continue
      box, = boxes
      self.assertEqual((box.get_x(), box.get_y()), (-0.5, -0.5))
      self.assertEqual((box.get_width(), box.get_height()), (inside, inside))
      self.assertFalse(box.get_clip_on())  # an edge on the border drawn whole
    self.assert_nothing_cut(fig)


class AttentionFigureTest(FigureTestCase):

  def _weights(self, length, heads=2):
    w = np.tril(np.random.default_rng(0).random((heads, length, length)))
    return w / w.sum(-1, keepdims=True)

  def test_attention_maps_have_key_label_colorbar_and_a_legend(self):
    tokens = [np.array([5, 6, 7, 2, 5, 6, 7, 1]), np.array([5, 6, 7, 8, 2, 5, 6, 7, 8, 1])]
    panels = [('rope, input length 3', [self._weights(8)] * 2),
              ('rope, input length 4', [self._weights(10)] * 2)]
    fig = plots.plot_attention_maps(panels, _path('attention_maps_rope.png'), tokens)
    maps = [ax for ax in fig.axes if ax.images]
    self.assertLen(maps, 2 * 2 * 2)  # panels × layers × heads
    for ax in maps:
      self.assertEqual(ax.get_xlabel(), 'key j')
    self.assertEqual(sum(ax.get_ylabel() == 'query i' for ax in maps), 4)  # a row each
    bar = self.colorbar_axes(fig)
    self.assertIn('attention weight', bar.yaxis.label.get_text())
    self.assertEqual(bar.get_ylim(), (0.0, 1.0))
    legend, = fig.legends
    self.assertEqual([t.get_text() for t in legend.get_texts()], [plots.SEP_MARK])
    self.assert_nothing_cut(fig)

  def test_alignments_and_entropy_are_labelled_and_inside_the_figure(self):
    target = np.array([3, 4, 5, 1])
    alignment = dict(weights=self._weights(4, heads=1)[0], prediction=np.array([3, 4, 6, 1]),
                     target=target)
    fig = plots.plot_alignments([('copy, input length 4', alignment)] * 2,
                                _path('attention_heatmap.png'))
    self.assertIn('attention weight', self.colorbar_axes(fig).yaxis.label.get_text())
    for ax in [ax for ax in fig.axes if ax.images]:
      self.assertEqual(ax.get_xlim(), (-0.5, 3.5))  # the wrong-row marks widen no axis
      marks, = ax.get_lines()
      self.assertEqual(list(marks.get_ydata()), [2])
    self.assert_nothing_cut(fig)
    curves = {f'entry{i}': np.log(np.arange(12) + 1.0) * 0.1 * i for i in range(9)}
    fig = plots.plot_entropy(curves, _path('attention_entropy.png'), train_tokens=6,
                             title='copy: attention entropy at input length 12')
    ax, = fig.axes
    self.assertEqual(ax.get_xlim(), (0.0, 11.0))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    self.assertIn('longest training sequence (6 tokens)', legend)
    self.assert_nothing_cut(fig)


if __name__ == '__main__':
  absltest.main()
