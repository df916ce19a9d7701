"""Figures, drawn from result rows only (so any workdir can be redrawn).

Every `plot_*` writes its PNG and returns the `matplotlib.figure.Figure`
(closed to pyplot, its artists intact) so tests can read labels, limits and
colours from it. Layouts are constrained: colorbars, legends beside the axes
and long labels stay inside the figure.
"""

from typing import Optional, Sequence

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import ticker  # pylint: disable=g-import-not-at-top
from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
import numpy as np

from attention_jax.lab.report import results

METRICS = (('token_accuracy', 'token accuracy'), ('exact_match', 'exact match'))

# Entries' colours: no greys, since the ceilings, the training-range marks and
# the shading are grey. tab20's strong shades, then its light ones, then
# tab20b's: 38 distinguishable lines.
_PALETTE = tuple(
    [c for k, c in enumerate(plt.get_cmap('tab20').colors) if k % 2 == 0 and k != 14]
    + [c for k, c in enumerate(plt.get_cmap('tab20').colors) if k % 2 == 1 and k != 15]
    + list(plt.get_cmap('tab20b').colors))


def _color(i: int) -> tuple:
  """Line i's colour (RGB): distinct for the first 38 lines, never grey."""
  return _PALETTE[i % len(_PALETTE)]


def _save(fig: Figure, path: str, dpi: int) -> Figure:
  """Writes `fig` to `path` and closes it to pyplot; returns it for tests."""
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return fig


def training_marks(ranges: dict[str, Optional[tuple[int, int]]]) -> dict:
  """How the training lengths are marked, from each source's `(min, max)`
  (None: unknown): `span` (the shaded range, or None), its `label`, `lines`
  (length, label) of vertical marks and `shared`. One range shared by every
  source (`shared`): that range, with 2×, 4×, 8× L_train dotted. Ranges that
  differ: their union shaded and labelled as one, and each L_train marked."""
  known = {name: r for name, r in ranges.items() if r}
  distinct = sorted(set(known.values()))
  if not distinct:
    return dict(span=None, label=None, lines=[], shared=False)
  if len(distinct) == 1:
    (lo, hi), = distinct
    return dict(span=(lo, hi), label='training lengths',
                lines=[(k * hi, f'{k}× L_train') for k in (2, 4, 8)], shared=True)
  each = ', '.join(f'{name or "?"} {lo}–{hi}' for name, (lo, hi) in known.items())
  span = (min(lo for lo, _ in distinct), max(hi for _, hi in distinct))
  lines = [(hi, f'L_train = {hi} (' + ', '.join(n for n, r in known.items() if r[1] == hi) + ')')
           for hi in sorted({hi for _, hi in distinct})]
  return dict(span=span, label=f'training lengths, union of {each}', lines=lines,
              shared=False)


_LEGEND_ROWS = 16  # legend lines (fontsize 8) that fit beside one 4.2-inch row of panels


def plot_extrapolation(rows: Sequence[dict], path: str, *, train_min: Optional[int] = None,
                       train_max: Optional[int] = None,
                       train_ranges: Optional[dict[str, Optional[tuple[int, int]]]] = None,
                       ceilings: Sequence[dict] = (),
                       ) -> Figure:
  """Accuracy vs input length: one line per encoding (mean over seeds), the
  seeds' min–max shaded, the training range marked. A row of two panels
  (token accuracy, exact match) per task; the x axis spans the task's
  evaluated lengths and no further (marks of longer lengths are left out).

  Rows may carry a `source` (the workdir they come from, for figures that
  combine several): lines are then labelled `SOURCE:ENCODING`, and
  `train_ranges` maps each source to its training lengths `(min, max)`
  (`training_marks`); else `train_min`, `train_max` are the one range.
  `ceilings` (`evaluate.ambiguity.ceiling_rows`): the k-gram ceiling of
  each task for k in CEILING_KS, dashed grey under exact match; entries'
  colours are never grey (`_color`). Returns the figure.
  """
  if train_ranges is None:
    train_ranges = {'': (train_min, train_max) if train_max else None}
  marks = training_marks(train_ranges)
  task_names = sorted({r['task'] for r in rows})
  fig, axes = plt.subplots(len(task_names), 2, figsize=(14, 4.2 * len(task_names)),
                           squeeze=False, layout='constrained')
  for row_axes, task in zip(axes, task_names):
    task_rows = [r for r in rows if r['task'] == task]
    evaluated = sorted({r['length'] for r in task_rows})
    keys = list(dict.fromkeys((r.get('source', ''), r['encoding']) for r in task_rows))
    for ax, (metric, title) in zip(row_axes, METRICS):
      for i, (source, enc) in enumerate(keys):
        sel = [r for r in task_rows if (r.get('source', ''), r['encoding']) == (source, enc)]
        # Diverged seeds (`train.divergence`): out of the line, counted in its label.
        seeds = results.seeds_cell(sel)
        sel, _ = results.split_diverged(sel)
        label = f'{source}:{enc}' if source else enc
        if not sel:  # every seed diverged: a legend entry, no line
          ax.plot([], [], label=f'{label} (seeds: {seeds})', color=_color(i), lw=1.8)
          continue
        lengths = sorted({r['length'] for r in sel})
        values = np.array([[r[metric] for r in sel if r['length'] == n] for n in lengths
                           ], dtype=object)
        mean = np.array([np.mean(v) for v in values])
        lo = np.array([np.min(v) for v in values])
        hi = np.array([np.max(v) for v in values])
        # Variants of an encoding (NAME:randomized, rope+pi) dashed.
        count = f'{seeds} seed' + ('s' if seeds != '1' else '') if seeds.isdigit() else (
            f'seeds: {seeds}')
        # A dot at each measured length: where the line is data, not interpolation.
        line, = ax.plot(lengths, 100 * mean, label=f'{label} ({count})', lw=1.8, marker='o',
                        ms=3, color=_color(i), ls='--' if (':' in enc or '+' in enc) else '-')
        ax.fill_between(lengths, 100 * lo, 100 * hi, color=line.get_color(), alpha=0.18)
      if metric == 'exact_match':
        _draw_ceiling(ax, [c for c in ceilings if c['task'] == task
                           and evaluated[0] <= c['length'] <= evaluated[-1]])
      _mark_training(ax, marks, evaluated)
      ax.set_ylabel(f'{title} (%)')
      ax.set_ylim(-2, 102)
      ax.set_title(f'{task}: {title}')
      ax.grid(alpha=0.3)
    # Off the data; in columns of at most _LEGEND_ROWS, so it never runs past the figure.
    entries = len(row_axes[1].get_legend_handles_labels()[1])
    row_axes[1].legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize=8,
                       ncol=-(-entries // _LEGEND_ROWS))
  return _save(fig, path, dpi=120)


def length_ticks(evaluated: Sequence[int]) -> list[int]:
  """The x ticks of a log2 length axis over the `evaluated` lengths: each of
  them when they are few, else the powers of 2 between the first and the
  last, and those two (a power too close to either left out, so no two labels
  overlap)."""
  if len(evaluated) <= 8:
    return sorted(evaluated)
  lo, hi = evaluated[0], evaluated[-1]
  powers = [2 ** k for k in range(int(np.ceil(np.log2(lo))), int(np.floor(np.log2(hi))) + 1)]
  apart = [p for p in powers if min(abs(np.log2(p / lo)), abs(np.log2(hi / p))) >= 0.4]
  return sorted({lo, hi, *apart})


def _mark_training(ax, marks: dict, evaluated: Sequence[int]) -> None:
  """The training range shaded and its marks (`training_marks`) on a log2
  length axis limited to the `evaluated` lengths (a mark past them is left
  out: it would stretch the axis to lengths nothing was measured at), ticks
  written as plain lengths."""
  lo, hi = evaluated[0], evaluated[-1]
  if marks['span']:
    ax.axvspan(*marks['span'], color='0.85', zorder=0, label=marks['label'])
  shown = [(length, mark) for length, mark in marks['lines'] if lo <= length <= hi]
  shared = marks['shared']
  for length, mark in shown:
    ax.axvline(length, color='0.6', lw=0.8, ls=':' if shared else '-.', zorder=0,
               label=None if shared else mark)
  ax.set_xscale('log', base=2)
  ax.set_xlim(lo / 2 ** 0.15, hi * 2 ** 0.15)  # a little room around the end points
  ax.set_xticks(length_ticks(evaluated), [f'{n:g}' for n in length_ticks(evaluated)])
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  if shared and shown:
    ax.set_xlabel('input length (log scale; dotted: '
                  + ', '.join(mark for _, mark in shown) + ')')
  else:
    ax.set_xlabel('input length (log scale)')


CEILING_KS = (2, 3, 4)  # the k-gram ceilings drawn (the ones that bind at 2× to 8×)


def _draw_ceiling(ax, rows: Sequence[dict]) -> None:
  """The task's k-gram ceilings (percent of strings a k-gram lookup can
  copy), thin dashed grey lines labelled by k, darker for larger k."""
  for k in CEILING_KS:
    sel = sorted((r['length'], r['unambiguous']) for r in rows if r['k'] == k)
    if sel:
      shade = str(0.75 - 0.2 * CEILING_KS.index(k))
      ax.plot([n for n, _ in sel], [100 * v for _, v in sel], color=shade, lw=1, ls=(0, (4, 2)),
              label=f'ceiling: {k}-gram lookup', zorder=1)


def plot_alignments(panels: Sequence[tuple[str, dict]], path: str) -> Figure:
  """Heat maps of attention weights, one panel per `(title, alignment)`, with
  `alignment` as returned by `evaluate.seq2seq_alignment`: rows are decoder
  steps (outputs), columns encoder positions (inputs); a wrong prediction's
  row is marked with a red triangle on the right border. Returns the figure."""
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False,
                           layout='constrained')
  for ax, (title, a) in zip(axes[0], panels):
    image = ax.imshow(a['weights'], cmap='viridis', vmin=0, vmax=1, aspect='auto',
                      interpolation='nearest')
    wrong = np.flatnonzero(a['prediction'] != a['target'])
    # Just right of the panel (axes x, data y): marks, not an encoder position.
    ax.plot(np.full(len(wrong), 1.03), wrong, '<', color='red', ms=6, clip_on=False,
            transform=ax.get_yaxis_transform())
    for axis in (ax.xaxis, ax.yaxis):  # positions and steps are whole numbers
      axis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel('encoder position j (input token)')
    ax.set_ylabel('decoder step i (output token; last = EOS)')
    correct = 100 * np.mean(a['prediction'] == a['target'])
    ax.set_title(f'{title}\n{correct:.0f}% of output tokens right (red ◀: wrong)')
  fig.colorbar(image, ax=axes, shrink=0.9, label='attention weight α_ij')
  return _save(fig, path, dpi=120)


def plot_training_curves(curves: dict[str, list[dict]], path: str) -> Figure:
  """Loss and token accuracy vs step, one line per run: `curves` maps a run's
  label to its `metrics.jsonl` rows. Returns the figure."""
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout='constrained')
  for i, (label, rows) in enumerate(curves.items()):
    steps = [r['step'] for r in rows]
    axes[0].plot(steps, [r['loss'] for r in rows], lw=1, label=label, color=_color(i))
    axes[1].plot(steps, [100 * r['token_accuracy'] for r in rows], lw=1, color=_color(i))
  axes[0].set_yscale('log')
  # Plain numbers (3.5, not 3.5×10⁰) on the log axis, minor ticks too when it spans little.
  axes[0].yaxis.set_major_formatter(ticker.LogFormatter())
  axes[0].yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
  axes[0].set_ylabel('training loss (output tokens)')
  axes[1].set_ylabel('training token accuracy (%)')
  axes[1].set_ylim(-2, 102)
  for ax in axes:
    ax.set_xlabel('step')
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  # Beside the panels, off the curves.
  fig.legend(loc='outside right upper', fontsize=7, ncol=-(-len(curves) // (2 * _LEGEND_ROWS)))
  return _save(fig, path, dpi=120)


SEP_MARK = 'dotted: separator (inputs before it, outputs from it on)'


def plot_attention_maps(panels: Sequence[tuple[str, list[np.ndarray]]], path: str,
                        tokens: Sequence[np.ndarray]) -> Figure:
  """A grid of heat maps: for each `(title, weights)` panel (weights per layer,
  `[H, T, T]` for one example), one row per layer and one column per head,
  queries down and keys across, one colorbar for all. `tokens[i]` (the input
  ids `[T]` of panel i) marks where outputs start (the separator, dotted,
  explained in a legend). Returns the figure."""
  rows = sum(len(w) for _, w in panels)
  heads = panels[0][1][0].shape[0]
  fig, axes = plt.subplots(rows, heads, figsize=(2.6 * heads + 1.2, 2.6 * rows + 0.4),
                           squeeze=False, layout='constrained')
  r = 0
  for (title, weights), toks in zip(panels, tokens):
    sep = int(np.flatnonzero(np.asarray(toks) == 2)[0])  # tasks.SEP
    for layer, w in enumerate(weights):
      length = w.shape[-1]
      for h in range(heads):
        ax = axes[r, h]
        image = ax.imshow(w[h], cmap='viridis', vmin=0, vmax=1, interpolation='nearest')
        for draw in (ax.axhline, ax.axvline):
          draw(sep - 0.5, color='white', lw=0.8, ls=':')
        # The first position, the separator's and the last: enough to read lengths.
        ticks = sorted({0, sep, length - 1})
        ax.set_xticks(ticks, ticks, fontsize=6)
        ax.set_yticks(ticks, ticks, fontsize=6)
        ax.set_xlabel('key j', fontsize=7, labelpad=1)
        ax.set_title(f'{title}\nlayer {layer}, head {h}' if h == 0 else f'head {h}',
                     fontsize=8, loc='left')
      axes[r, 0].set_ylabel('query i', fontsize=8)
      r += 1
  fig.colorbar(image, ax=axes, shrink=min(1.0, 0.5 + 0.25 * rows),
               label='attention weight (row sums to 1)')
  fig.legend(handles=[plt.Line2D([], [], color='0.3', lw=1, ls=':', label=SEP_MARK)],
             loc='outside lower center', fontsize=8, frameon=False)
  return _save(fig, path, dpi=110)


def plot_entropy(curves: dict[str, np.ndarray], path: str, *, train_tokens: int,
                 title: str) -> Figure:
  """Attention entropy vs query position, one line per encoding (`curves`:
  label -> `[T]`), with the uniform-attention curve log(i + 1) and the
  longest training sequence. Returns the figure."""
  fig, ax = plt.subplots(figsize=(8, 4.6), layout='constrained')
  for i, (label, entropy) in enumerate(curves.items()):
    ax.plot(np.arange(len(entropy)), entropy, lw=1.6, label=label, color=_color(i))
  longest = max(len(e) for e in curves.values())
  ax.plot(np.arange(longest), np.log(np.arange(longest) + 1), 'k--', lw=1,
          label='uniform over keys 0…i')
  ax.axvline(train_tokens - 0.5, color='0.5', lw=1, ls=':',
             label=f'longest training sequence ({train_tokens} tokens)')
  ax.set_xlim(0, longest - 1)
  ax.set_xlabel('query position i')
  ax.set_ylabel('attention entropy (nats)\nmean over heads, layers, examples')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, ncol=2)
  return _save(fig, path, dpi=120)


def plot_grid(rows: Sequence[dict], path: str, *, train_max: int) -> Optional[Figure]:
  """Exact match (%) over (digits of a) × (digits of b), one panel per label
  (mean over seeds), the training region outlined on the cells' edges:
  `evaluate.grid`'s rows. Small grids get each cell's value written in it.
  Returns the figure (None, nothing written, for no rows)."""
  labels = sorted({(r['task'], r['encoding']) for r in rows})
  if not labels:
    return None
  one_task = len({task for task, _ in labels}) == 1  # the file's name says which
  columns = min(5, len(labels))
  lines = -(-len(labels) // columns)
  # 'compressed': constrained for panels of a fixed aspect (square cells).
  fig, axes = plt.subplots(lines, columns, figsize=(2.5 * columns + 1.0, 3.0 * lines + 0.4),
                           squeeze=False, layout='compressed')
  for ax in axes.flat[len(labels):]:
    ax.axis('off')
  for n, (ax, (task, label)) in enumerate(zip(axes.flat, labels)):
    sel = [r for r in rows if r['task'] == task and r['encoding'] == label]
    sizes = sorted({r['digits_a'] for r in sel} | {r['digits_b'] for r in sel})
    grid = np.full((len(sizes), len(sizes)), np.nan)
    for i, la in enumerate(sizes):
      for j, lb in enumerate(sizes):
        values = [r['exact_match'] for r in sel if r['digits_a'] == la and r['digits_b'] == lb]
        if values:
          grid[i, j] = 100 * np.mean(values)
    image = ax.imshow(grid, vmin=0, vmax=100, cmap='viridis', origin='lower')
    if len(sizes) <= 8:
      for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
          ax.text(j, i, f'{value:.0f}', ha='center', va='center', fontsize=7,
                  color='white' if value < 60 else 'black')
    inside = sum(s <= train_max for s in sizes)  # sizes are sorted: the first `inside`
    if inside:
      # On the cells' outer edges; unclipped and over the spines, so an edge on
      # the panel's border is drawn whole like the others.
      ax.add_patch(plt.Rectangle((-0.5, -0.5), inside, inside, fill=False, ec='red', lw=1.5,
                                 clip_on=False, zorder=3))
    ax.set_xlim(-0.5, len(sizes) - 0.5)
    ax.set_ylim(-0.5, len(sizes) - 0.5)
    ax.set_xticks(range(len(sizes)), sizes, fontsize=7)
    ax.set_yticks(range(len(sizes)), sizes, fontsize=7)
    ax.set_xlabel('digits of b', fontsize=8)
    if n % columns == 0:  # one label per row of panels: no overlap with the next
      ax.set_ylabel('digits of a', fontsize=8)
    ax.set_title(label if one_task else f'{task}: {label}', fontsize=9)
  fig.colorbar(image, ax=axes, shrink=0.8, pad=0.02, label='exact match (%, mean over seeds)')
  fig.suptitle(f'Exact match (%); red: both operands within the training range '
               f'(<= {train_max} digits)', fontsize=10)
  return _save(fig, path, dpi=110)
