"""The suite's outputs: results.csv (one row per run), summary.md (the
overview table, a table per task, the published numbers beside ours) and
chomsky.png (tasks × encodings, grouped by Chomsky level, as the papers
show them).

A setting's score (task × encoding): its best run over seeds and learning
rates (`max`, the papers' statistic), and the mean ± std over the seeds of
the learning rate with the best mean, with that learning rate's worst seed
(`min`) beside it (one seed: its score alone). A seed whose training loss became
non-finite (`trainer.diverged_steps`) is left out of both, marked in
results.csv's `diverged_at` and counted in summary.md and the figure.

The hard set (`chomsky.hard`: parity of all ones, bucket_sort of equal
tokens, …), where the task has one: results.csv's `hard_exact` (per run,
the fraction of hard inputs exact) and summary.md's hard table (per setting,
the seeds exact on every hard input, of the learning rate with the best
mean). Records of older code have none: their cells say so.
"""

import os
from typing import Optional

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
import numpy as np

from attention_jax.lab.report import result_files
from attention_jax.lab.report import results
from attention_jax.lab.evaluate import suite_hard as hard_set
from attention_jax.lab.report import published
from attention_jax.lab.tasks import SPECS
from attention_jax.lab.train.divergence import DIVERGED

# The suite's figure: tasks × encodings, grouped by Chomsky level.
FIGURE = 'chomsky.png'

LEVEL_TITLES = {'regular': 'Regular (R)', 'context_free': 'Deterministic context-free (DCF)',
                'context_sensitive': 'Context-sensitive (CS)'}
SCORES = ('score_official', 'score_plain', 'in_range')


def combine(records: list[dict]) -> dict:
  """(task, encoding) -> {score: {'max', 'mean', 'std', 'min', 'seeds',
  'learning_rate'} (min and seeds: of the learning rate with the best mean), and
  'train_accuracy': the best learning rate's last-chunk training accuracy,
  mean over seeds}."""
  by_setting = {}
  for r in records:
    by_setting.setdefault((r['task'], r['encoding']), []).append(r)
  out = {}
  # A learning rate whose seeds all diverged has NaN scores: never the best.
  finite = lambda x: x if np.isfinite(x) else -np.inf
  for key, group in by_setting.items():
    scores = {}
    for name in SCORES:
      best = max(group, key=lambda r: finite(r['scores'][name]['mean']))
      maxima = [r['scores'][name]['max'] for r in group if np.isfinite(r['scores'][name]['max'])]
      kept = [s[name] for s, step in zip(best['per_seed'], _diverged(best)) if step is None]
      scores[name] = dict(max=max(maxima) if maxima else float('nan'),
                          mean=best['scores'][name]['mean'], std=best['scores'][name]['std'],
                          min=float(np.min(kept)) if kept else float('nan'), seeds=len(kept),
                          learning_rate=best['learning_rate'])
    best = max(group, key=lambda r: finite(r['scores']['score_official']['mean']))
    if best.get('hard') and any(best['hard']):  # per kept seed: (seed, fraction, rows)
      scores['hard'] = [(seed, hard_set.exact_fraction(rows), rows)
                        for seed, rows, step in zip(best['seeds'], best['hard'], _diverged(best))
                        if step is None]
    scores['train_accuracy'] = float(np.mean(best.get('train_accuracy', [np.nan])))
    scores['runs'] = sum(len(r['seeds']) for r in group)
    scores['diverged'] = [(r['learning_rate'], seed, step) for r in group
                          for seed, step in zip(r['seeds'], _diverged(r)) if step is not None]
    out[key] = scores
  return out


def _diverged(record: dict) -> list:
  """Per seed, None or the step it diverged at (records before the field: none)."""
  return record.get('diverged_at') or [None] * len(record['seeds'])


def diverged_text(record: dict) -> str:
  """'1 of 3 seeds diverged (seed 2 at step 40)', or '' if none did."""
  found = [(seed, step) for seed, step in zip(record['seeds'], _diverged(record))
           if step is not None]
  if not found:
    return ''
  return (f"{len(found)} of {len(record['seeds'])} seeds diverged ("
          + ', '.join(f'seed {seed} at step {step}' for seed, step in found) + ')')


def diverged_message(records: list[dict]) -> Optional[str]:
  """The entry points' last line when a seed diverged; None if none."""
  runs = [f"{r['task']} × {r['encoding']} (lr {r['learning_rate']:g}): {diverged_text(r)}"
          for r in records if diverged_text(r)]
  if not runs:
    return None
  return (f'error: training diverged (non-finite loss) in {len(runs)} setting(s): '
          + '; '.join(runs) + f'; left out of the max and mean, marked in results.csv '
          f'(diverged_at) and summary.md. Exit status {DIVERGED}.')


def _lost(s: dict) -> str:
  """A summary cell's note on its diverged runs ('' if none)."""
  if not s['diverged']:
    return ''
  steps = ', '.join(str(step) for _, _, step in s['diverged'])
  return (f" [{s['runs'] - len(s['diverged'])} of {results.plural(s['runs'], 'run')}; "
          f"{len(s['diverged'])} diverged at step{'s' * (len(s['diverged']) > 1)} {steps}]")


def write_outputs(records: list[dict], config, workdir: str) -> None:
  """results.csv, summary.md and chomsky.png into `workdir`."""
  _write_csv(records, os.path.join(workdir, 'results.csv'))
  combined = combine(records)
  task_names = list(config.study.tasks)
  encodings = list(config.study.encodings)
  result_files.write_text(os.path.join(workdir, 'summary.md'),
                     summary(combined, task_names, encodings, config))
  figure(combined, task_names, encodings, os.path.join(workdir, FIGURE),
         title=f'test lengths {config.task.train_max_length + 2}–{config.eval.max_length} '
               f'after training on {config.task.train_min_length}–{config.task.train_max_length}')


def _write_csv(records, path):
  fields = ['task', 'level', 'encoding', 'learning_rate', 'seed', *SCORES, 'diverged_at',
            'hard_exact']
  result_files.write_table(path, fields, (
      dict(task=r['task'], level=r['level'], encoding=r['encoding'],
           learning_rate=r['learning_rate'], seed=seed, **{k: f'{s[k]:.4f}' for k in SCORES},
           diverged_at='' if step is None else step,
           hard_exact='' if not hard else f'{hard_set.exact_fraction(hard):.4f}')
      for r in records for seed, s, step, hard in zip(
          r['seeds'], r['per_seed'], _diverged(r), r.get('hard') or [None] * len(r['seeds']))))


def _level(task_name):
  return SPECS[task_name].level


def _pct(x):
  return f'{100 * x:.1f}'


def spread(score: dict) -> str:
  """'mean ± std, worst W' of a `combine` score over its seeds; one seed's
  score alone (no spread to show)."""
  if score.get('seeds', 2) == 1:
    return _pct(score['mean'])
  worst = f', worst {_pct(score["min"])}' if 'min' in score else ''
  return f'{_pct(score["mean"])} ± {_pct(score["std"])}{worst}'


def summary(combined, task_names, encodings, config) -> str:
  """summary.md's text (module docstring)."""
  t, e, lengths = config.train, config.eval, config.task
  lost = [f'{name} × {enc}{_lost(s)}' for (name, enc), s in combined.items() if s['diverged']]
  lines = [
      '# DeepMind length-generalization suite: the encoder protocol', '',
      *(['**Diverged runs** (training loss NaN or infinite), left out of every max and mean: '
         + '; '.join(lost) + '.', ''] if lost else []),
      f'Trained on lengths {lengths.train_min_length}–{lengths.train_max_length} '
      f'({t.num_steps:,} steps, batch '
      f'{t.batch_size}, {config.model.num_layers} layer{"s" * (config.model.num_layers != 1)}, '
      f'd_model {config.model.d_model}); '
      f'evaluated on {e.min_length}–{e.max_length}, {e.num_samples} samples per length; seeds '
      f'{tuple(config.study.seeds)}, learning rates {tuple(config.study.learning_rates)}.', '',
      f'**Score** (accuracy %, their average: test lengths {lengths.train_max_length + 2}–'
      f'{e.max_length}, skipping {lengths.train_max_length + 1} as their code does): the best '
      'run over seeds and learning rates, as the papers report it, then the mean ± std over '
      'seeds and the worst seed (of the learning rate with the best mean).', '',
      '| level | task | ' + ' | '.join(encodings) + ' |',
      '|---|---|' + '---|' * len(encodings)]
  for name in task_names:
    cells = []
    for enc in encodings:
      s = combined.get((name, enc))
      cells.append('–' if s is None else
                   f'{_pct(s["score_official"]["max"])} ({spread(s["score_official"])})'
                   + _lost(s))
    lines.append(f'| {_level(name)} | {name} | ' + ' | '.join(cells) + ' |')
  lines += randomized_gains(combined, task_names, encodings)
  lines += beside_published(combined, task_names, encodings)
  lines += ['', '## Per task', '',
            f'`official`: lengths {lengths.train_max_length + 2}–{e.max_length} (their '
            f'average); `plain`: {lengths.train_max_length + 1}–{e.max_length}; `train`: '
            f'accuracy on the training batches of the last {t.steps_per_call} steps (dropout '
            'on), mean over seeds. Max over runs, then mean ± std and the worst seed.', '']
  for name in task_names:
    lines += [f'### {name} ({_level(name)})', '',
              '| encoding | official max | official mean ± std, worst | plain max | '
              'plain mean ± std, worst '
              '| train | published (DAPE 2024) |',
              '|---|---|---|---|---|---|---|']
    for enc in encodings:
      s = combined.get((name, enc))
      if s is None:
        continue
      o, p = s['score_official'], s['score_plain']
      pub = published.dape_2024(name, enc)
      lines.append(f'| {enc}{_lost(s)} | {_pct(o["max"])} | {spread(o)} | '
                   f'{_pct(p["max"])} | {spread(p)} | '
                   f'{_pct(s["train_accuracy"])} | {"–" if pub is None else f"{pub:.2f}"} |')
    lines.append('')
  lines += hard_table(combined, task_names, encodings)
  lines += [f'Published values: {published.DAPE_2024_SOURCE}. '
            f'{published.RUOSS_2023_SOURCE}.', '']
  return '\n'.join(lines)


def hard_table(combined, task_names, encodings) -> list[str]:
  """summary.md's hard-set table (module docstring): per task with a hard
  set and encoding, 'k of S' seeds exact on every hard input, the exact
  match over them (mean ± std, worst seed) and the cases the worst seed
  fails."""
  shown = [n for n in task_names if hard_set.has_cases(SPECS[n])]
  if not shown:
    return []
  lines = ['## Hard cases', '',
           'Each setting\'s models (the learning rate with the best mean) on the hard inputs '
           'at every evaluated length (tasks/hard_cases.py CHOMSKY: parity of all ones, '
           'bucket_sort of equal or sorted tokens, one symbol, alternating, period 3): seeds '
           'exact on every one, the fraction exact (mean ± std, worst seed), and the cases the '
           'worst seed gets wrong. – : no hard scores (a record written by older code, or every seed '
           'diverged).', '',
           '| task | encoding | exact on all | hard inputs exact | worst seed fails |',
           '|---|---|---|---|---|']
  for name in shown:
    for enc in encodings:
      s = combined.get((name, enc))
      if s is None or not s.get('hard'):
        lines.append(f'| {name} | {enc} | – | – | – |')
        continue
      fractions = [f for _, f, _ in s['hard']]
      perfect = sum(f == 1.0 for f in fractions)
      _, _, rows = min(s['hard'], key=lambda h: h[1])
      failed = list(dict.fromkeys(r['case'] for r in rows if r['exact_match'] < 1.0))
      lines.append(f'| {name} | {enc} | {perfect} of {len(fractions)} | '
                   f'{results.cell(fractions)} | {", ".join(failed) or "none"} |')
  return lines + ['']


def randomized_gains(combined, task_names, encodings) -> list[str]:
  """summary.md's lines on each encoding run both plain and ':randomized':
  the mean over tasks of randomized minus plain (official score, best run
  and seed mean, points) and on how many tasks randomized is ahead."""
  pairs = [(e, f'{e}:randomized') for e in encodings if f'{e}:randomized' in encodings]
  rows = []
  for plain, rand in pairs:
    both = [n for n in task_names if (n, plain) in combined and (n, rand) in combined]
    if not both:
      continue
    gain = {k: [100 * (combined[(n, rand)]['score_official'][k]
                       - combined[(n, plain)]['score_official'][k]) for n in both]
            for k in ('max', 'mean')}
    rows.append(f'| {plain} | {np.mean(gain["max"]):+.1f} | {np.mean(gain["mean"]):+.1f} | '
                f'{sum(g > 0 for g in gain["max"])} of {len(both)} |')
  if not rows:
    return []
  return ['', '## Randomized against plain', '',
          'Randomized minus plain, official score in points, mean over tasks: of the best '
          'runs, of the seed means; and the tasks where the randomized best run is ahead.', '',
          '| encoding | best run | seed mean | randomized ahead |', '|---|---|---|---|', *rows]


def beside_published(combined, task_names, encodings) -> list[str]:
  """summary.md's table of ours (best run, official score) beside DAPE's
  Table 2 for the encodings it reports (`published.DAPE_2024_COLUMNS`)."""
  shown = [e for e in encodings if e in published.DAPE_2024_COLUMNS]
  if not shown:
    return []
  lines = ['', '## Beside the published numbers', '',
           f'Ours (best run, official score) / published: {published.DAPE_2024_SOURCE}.', '',
           '| task | ' + ' | '.join(f'{e}: ours / DAPE' for e in shown) + ' |',
           '|---|' + '---|' * len(shown)]
  for name in task_names:
    cells = []
    for enc in shown:
      s, pub = combined.get((name, enc)), published.dape_2024(name, enc)
      cells.append(f'{"–" if s is None else _pct(s["score_official"]["max"])} / '
                   f'{"–" if pub is None else f"{pub:.2f}"}')
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return lines


def figure(combined, task_names, encodings, path: str, title: str = '') -> Figure:
  """Heatmap of the official score (best run, %), tasks grouped by level;
  returns the figure (closed to pyplot) for tests to read."""
  grid = np.full((len(task_names), len(encodings)), np.nan)
  for i, name in enumerate(task_names):
    for j, enc in enumerate(encodings):
      s = combined.get((name, enc))
      if s is not None:
        grid[i, j] = 100 * s['score_official']['max']
  # Tall enough for the colorbar's label whatever the number of tasks.
  fig, ax = plt.subplots(figsize=(1.0 * len(encodings) + 3.5,
                                  max(3.0, 0.42 * len(task_names) + 1.8)), layout='constrained')
  image = ax.imshow(grid, cmap='viridis', vmin=0, vmax=100, aspect='auto')
  for i in range(grid.shape[0]):
    for j in range(grid.shape[1]):
      s = combined.get((task_names[i], encodings[j]))
      lost = f"\n{len(s['diverged'])}/{s['runs']} div." if s and s['diverged'] else ''
      if not np.isnan(grid[i, j]):
        ax.text(j, i, f'{grid[i, j]:.0f}{lost}', ha='center', va='center', fontsize=7,
                color='white' if grid[i, j] < 60 else 'black')
      elif lost:  # every run diverged: no score, said so
        ax.text(j, i, 'diverged', ha='center', va='center', fontsize=6, color='red')
  ax.set_xticks(range(len(encodings)), encodings, rotation=40, ha='right', fontsize=8)
  levels = [SPECS[name].level for name in task_names]
  ax.set_yticks(range(len(task_names)),
                [f'{n} [{LEVEL_TITLES[lv].split("(")[1][:-1]}]' for n, lv in
                 zip(task_names, levels)], fontsize=8)
  for i in range(1, len(levels)):
    if levels[i] != levels[i - 1]:
      ax.axhline(i - 0.5, color='white', linewidth=2.5)
  bar = fig.colorbar(image, ax=ax)
  bar.set_label('accuracy on test lengths (%)\nbest run over seeds', fontsize=8)
  bar.ax.tick_params(labelsize=8)
  shown = [LEVEL_TITLES[lv] for lv in LEVEL_TITLES if lv in levels]  # the tick labels' key
  ax.set_title('\n'.join(filter(None, [title, ', '.join(shown)])), fontsize=9)
  fig.savefig(path + '.tmp.png', dpi=130)
  plt.close(fig)
  os.replace(path + '.tmp.png', path)
  return fig
