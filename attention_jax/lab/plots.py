"""Figures, drawn from result rows only (so any workdir can be redrawn)."""

from typing import Optional, Sequence

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from attention_jax.lab import results

METRICS = (('token_accuracy', 'token accuracy'), ('exact_match', 'exact match'))


def _color(i: int):
  """Line i's colour: tab20's strong shades first, then its light ones, so up
  to 20 encodings stay distinguishable."""
  return plt.get_cmap('tab20')(((2 * i) % 20 if i < 10 else (2 * i + 1) % 20) / 19)


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


def plot_extrapolation(rows: Sequence[dict], path: str, *, train_min: Optional[int] = None,
                       train_max: Optional[int] = None,
                       train_ranges: Optional[dict[str, Optional[tuple[int, int]]]] = None,
                       ceilings: Sequence[dict] = (),
                       ) -> None:
  """Accuracy vs input length: one line per encoding (mean over seeds), the
  seeds' min–max shaded, the training range marked. A row of two panels
  (token accuracy, exact match) per task.

  Rows may carry a `source` (the workdir they come from, for figures that
  combine several): lines are then labelled `SOURCE:ENCODING`, and
  `train_ranges` maps each source to its training lengths `(min, max)`
  (`training_marks`); else `train_min`, `train_max` are the one range.
  `ceilings` (`evaluate.ambiguity.ceiling_rows`): the k-gram ceiling of
  each task for k in CEILING_KS, dashed grey under exact match.
  """
  if train_ranges is None:
    train_ranges = {'': (train_min, train_max) if train_max else None}
  marks = training_marks(train_ranges)
  task_names = sorted({r['task'] for r in rows})
  fig, axes = plt.subplots(len(task_names), 2, figsize=(14, 4.2 * len(task_names)),
                           squeeze=False)
  for row_axes, task in zip(axes, task_names):
    task_rows = [r for r in rows if r['task'] == task]
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
        line, = ax.plot(lengths, 100 * mean, label=f'{label} ({count})', lw=1.8,
                        color=_color(i), ls='--' if (':' in enc or '+' in enc) else '-')
        ax.fill_between(lengths, 100 * lo, 100 * hi, color=line.get_color(), alpha=0.18)
      if metric == 'exact_match':
        _draw_ceiling(ax, [c for c in ceilings if c['task'] == task])
      if marks['span']:
        ax.axvspan(*marks['span'], color="0.85", zorder=0, label=marks['label'])
      shared = marks['shared']
      for length, mark in marks['lines']:
        ax.axvline(length, color='0.6', lw=0.8, ls=':' if shared else '-.', zorder=0,
                   label=None if shared else mark)
      ax.set_xscale('log', base=2)
      ax.set_xlabel('input length (log scale; dotted: 2×, 4×, 8× L_train)' if shared
                    else 'input length (log scale)')
      ax.set_ylabel(f'{title} (%)')
      ax.set_ylim(-2, 102)
      ax.set_title(f'{task}: {title}')
      ax.grid(alpha=0.3)
    row_axes[1].legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize=8)  # off the data
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


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


def plot_alignments(panels: Sequence[tuple[str, dict]], path: str) -> None:
  """Heat maps of attention weights, one panel per `(title, alignment)`, with
  `alignment` as returned by `evaluate.seq2seq_alignment`: rows are decoder
  steps (outputs), columns encoder positions (inputs); a wrong prediction's
  row is marked with a red tick."""
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
  for ax, (title, a) in zip(axes[0], panels):
    image = ax.imshow(a['weights'], cmap='viridis', vmin=0, vmax=1, aspect='auto',
                      interpolation='nearest')
    wrong = np.flatnonzero(a['prediction'] != a['target'])
    ax.plot(np.full(len(wrong), -0.9), wrong, '>', color='red', ms=4, clip_on=False)
    ax.set_xlabel('encoder position j (input token)')
    ax.set_ylabel('decoder step i (output token; last = EOS)')
    correct = 100 * np.mean(a['prediction'] == a['target'])
    ax.set_title(f'{title}\n{correct:.0f}% of output tokens right (red: wrong)')
    fig.colorbar(image, ax=ax, fraction=0.046, label='α_ij')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_training_curves(curves: dict[str, list[dict]], path: str) -> None:
  """Loss and token accuracy vs step, one line per run: `curves` maps a run's
  label to its `metrics.jsonl` rows."""
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  for label, rows in curves.items():
    steps = [r['step'] for r in rows]
    line, = axes[0].plot(steps, [r['loss'] for r in rows], lw=1, label=label)
    axes[1].plot(steps, [100 * r['token_accuracy'] for r in rows], lw=1,
                 color=line.get_color())
  axes[0].set_yscale('log')
  axes[0].set_ylabel('training loss (output tokens)')
  axes[1].set_ylabel('training token accuracy (%)')
  for ax in axes:
    ax.set_xlabel('step')
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_attention_maps(panels: Sequence[tuple[str, list[np.ndarray]]], path: str,
                        tokens: Sequence[np.ndarray]) -> None:
  """A grid of heat maps: for each `(title, weights)` panel (weights per layer,
  `[H, T, T]` for one example), one row per layer and one column per head.
  `tokens[i]` (the input ids of panel i) marks where outputs start (SEP)."""
  rows = sum(len(w) for _, w in panels)
  heads = panels[0][1][0].shape[0]
  fig, axes = plt.subplots(rows, heads, figsize=(2.6 * heads, 2.5 * rows), squeeze=False)
  r = 0
  for (title, weights), toks in zip(panels, tokens):
    sep = int(np.flatnonzero(np.asarray(toks) == 2)[0])  # tasks.SEP
    for layer, w in enumerate(weights):
      for h in range(heads):
        ax = axes[r, h]
        ax.imshow(w[h], cmap='viridis', vmin=0, vmax=1, interpolation='nearest')
        ax.axhline(sep - 0.5, color='white', lw=0.6, ls=':')
        ax.axvline(sep - 0.5, color='white', lw=0.6, ls=':')
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f'{title}\nlayer {layer}, head {h}' if h == 0 else f'head {h}',
                     fontsize=8, loc='left')
      axes[r, 0].set_ylabel('query i')
      r += 1
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_entropy(curves: dict[str, np.ndarray], path: str, *, train_tokens: int,
                 title: str) -> None:
  """Attention entropy vs query position, one line per encoding, with the
  uniform-attention curve log(i + 1) and the longest training sequence."""
  fig, ax = plt.subplots(figsize=(8, 4.6))
  for i, (label, entropy) in enumerate(curves.items()):
    ax.plot(np.arange(len(entropy)), entropy, lw=1.6, label=label, color=_color(i))
  longest = max(len(e) for e in curves.values())
  ax.plot(np.arange(longest), np.log(np.arange(longest) + 1), 'k--', lw=1,
          label='uniform over keys 0…i')
  ax.axvline(train_tokens - 0.5, color='0.5', lw=1, ls=':')
  ax.text(train_tokens, ax.get_ylim()[1] * 0.95, ' longest training sequence',
          fontsize=8, color='0.4', va='top')
  ax.set_xlabel('query position i')
  ax.set_ylabel('attention entropy (nats, mean over heads, layers, examples)')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_grid(rows: Sequence[dict], path: str, *, train_max: int) -> None:
  """Exact match over (digits of a) × (digits of b), one panel per label
  (mean over seeds), the training region outlined: `evaluate.grid`'s rows."""
  labels = sorted({(r['task'], r['encoding']) for r in rows})
  if not labels:
    return
  columns = min(5, len(labels))
  lines = -(-len(labels) // columns)
  fig, axes = plt.subplots(lines, columns, figsize=(2.6 * columns + 1, 2.6 * lines),
                           squeeze=False)
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
          grid[i, j] = np.mean(values)
    image = ax.imshow(grid, vmin=0, vmax=1, cmap='viridis', origin='lower')
    inside = sum(s <= train_max for s in sizes)
    if inside:  # the cells with both operands in the training range
      ax.add_patch(plt.Rectangle((-0.5, -0.5), inside, inside, fill=False, ec='red', lw=1.5))
    ax.set_xticks(range(len(sizes)), sizes, fontsize=7)
    ax.set_yticks(range(len(sizes)), sizes, fontsize=7)
    ax.set_xlabel('digits of b', fontsize=8)
    if n % columns == 0:  # one label per row of panels: no overlap with the next
      ax.set_ylabel('digits of a', fontsize=8)
    ax.set_title(label if task == 'addition' else f'{task}: {label}', fontsize=9)
  fig.colorbar(image, ax=axes, shrink=0.8, label='exact match (mean over seeds)')
  fig.suptitle(f'Exact match; red: both operands within the training range (<= {train_max})',
               fontsize=10)
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)
