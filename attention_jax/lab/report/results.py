"""Result rows as Markdown: the summary, the comparison of two studies, the
ceiling and failure tables (the files themselves: `result_files`)."""

from typing import Optional, Sequence

import numpy as np

from attention_jax.lab.report.result_files import DIVERGED
from attention_jax.lab.report.result_files import FAILURE_FIELDS
from attention_jax.lab.report.result_files import HARD
from attention_jax.lab.report.result_files import STEPS

MULTIPLES = (2, 4, 8)  # summary columns: accuracy at these multiples of L_train


def run_table(rows: Sequence[dict]) -> str:
  """One run's rows as the text `experiments.train` prints: a table per
  evaluated variant (the encoding, then e.g. rope+pi, rope+yarn) and task
  scored (`eval.tasks`), each headed by its label as results.csv's encoding
  column writes it."""
  blocks = []
  for label, task in dict.fromkeys((r['encoding'], r['task']) for r in rows):
    lines = [f"{label} ({task}, seed {rows[0]['seed']}):",
             f"{'length':>8} {'token acc':>10} {'exact':>8}"]
    lines += [f"{r['length']:>8} {100 * r['token_accuracy']:>9.1f}% "
              f"{100 * r['exact_match']:>7.1f}%" for r in rows
              if (r['encoding'], r['task']) == (label, task)]
    blocks.append('\n'.join(lines))
  return '\n\n'.join(blocks)


def _per_seed(rows, lengths) -> list[float]:
  """For each seed, the metric averaged over `lengths` (missing: no value)."""
  by_seed: dict[int, list[float]] = {}
  for r in rows:
    if r['length'] in lengths:
      by_seed.setdefault(r['seed'], []).append(r['value'])
  return [float(np.mean(v)) for v in by_seed.values()]


def split_diverged(rows: Sequence[dict]) -> tuple[list[dict], dict]:
  """The rows of runs that did not diverge, and {seed: step} of those that
  did (`train.divergence`), for rows of one (task, encoding)."""
  steps = {r['seed']: r[DIVERGED] for r in rows if r.get(DIVERGED) is not None}
  return [r for r in rows if r['seed'] not in steps], steps


def seeds_cell(rows: Sequence[dict]) -> str:
  """How many seeds a mean covers: '3', or '2 of 3; 1 diverged at step 40'."""
  kept, steps = split_diverged(rows)
  total = len({r['seed'] for r in rows})
  if not steps:
    return str(total)
  at = ', '.join(str(steps[s]) for s in sorted(steps))
  return (f"{total - len(steps)} of {total}; {len(steps)} diverged at step"
          f"{'s' if len(steps) > 1 else ''} {at}")


def steps_by_entry(rows: Sequence[dict]) -> dict:
  """{encoding: its training steps ('1,600', or '5, 3,000' for runs that
  differ)} when the rows' entries had different step budgets; {} when they
  all had the same (or the rows do not say), so a table shows the column
  only where it tells something."""
  found = {}
  for r in rows:
    if r.get(STEPS) is not None:
      found.setdefault(r['encoding'], set()).add(r[STEPS])
  if len({n for steps in found.values() for n in steps}) <= 1:
    return {}
  return {enc: ', '.join(f'{n:,}' for n in sorted(steps)) for enc, steps in found.items()}


def cell(values: Sequence[float]) -> str:
  """Per-seed values as a table cell, in percent: the value of one seed;
  of several, 'mean ± std, worst W', W the lowest seed's."""
  if not values:
    return '—'
  if len(values) == 1:
    return f'{100 * values[0]:.1f}'
  return (f'{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}, '
          f'worst {100 * np.min(values):.1f}')


def plural(count: int, noun: str) -> str:
  """'1 run', '2 runs'."""
  return f'{count} {noun}{"" if count == 1 else "s"}'


def number(value: float, digits: int = 1) -> str:
  """`value` with `digits` decimals, or as an int when it is one ('3', '2.5')."""
  return str(int(value)) if float(value).is_integer() else f'{value:.{digits}f}'


def summary_markdown(rows: Sequence[dict], train_min: int, train_max: int,
                     hard_sets: Optional[dict] = None) -> str:
  """Per task and metric, a table: encoding × (training range, 2×, 4×, 8×),
  each cell mean ± std over seeds, in percent. `hard_sets`: each task's
  kinds of hard case (`Task.hard_set`), named above its hard table."""
  lines = diverged_note(rows)
  lines += [f'Accuracy in percent, mean ± std over seeds, then the worst seed\'s (one '
           f'seed: its value). Training inputs had '
           f'lengths {train_min}–{train_max} (L_train = {train_max}); "1–L" '
           'averages every evaluated length up to L_train, the other columns '
           'are the accuracy at exactly that input length.', '']
  header = ['encoding', 'seeds', f'1–L ({train_max})'] + [
      f'{k}×L ({k * train_max})' for k in MULTIPLES]
  for task in sorted({r['task'] for r in rows}):
    metrics = [('token_accuracy', 'token accuracy'), ('exact_match', 'exact match')]
    if any(r.get(HARD) is not None for r in rows if r['task'] == task):
      metrics.append((HARD, 'hard cases, exact match'))
    for metric, title in metrics:
      lines += [f'### {task}: {title}', '',
                '| ' + ' | '.join(header) + ' |',
                '|' + '---|' * len(header)]
      encodings = list(dict.fromkeys(r['encoding'] for r in rows if r['task'] == task))
      steps = steps_by_entry([r for r in rows if r['task'] == task])
      if steps:  # budgets differ: each entry's, beside its seeds
        lines[-2:] = ['The entries were trained for different numbers of steps (the steps '
                      'column): compare them knowing that.', '',
                      '| ' + ' | '.join(header[:2] + ['steps'] + header[2:]) + ' |',
                      '|' + '---|' * (len(header) + 1)]
      if metric == HARD:
        kinds = (hard_sets or {}).get(task)
        lines[-2:-2] = ['Exact match on the hard cases at each length (tasks/hard_cases.py'
                        + (f': {kinds}' if kinds else '') + '), scored as the uniform table '
                        'above; the details in hard.csv and below.', '']
      for enc in encodings:
        sel = [dict(r, value=r[metric]) for r in rows
               if r['task'] == task and r['encoding'] == enc and r.get(metric) is not None]
        if not sel:
          continue
        seeds = seeds_cell(sel) + (f" | {steps.get(enc, '?')}" if steps else '')
        sel, _ = split_diverged(sel)  # out of the means, counted in the seeds column
        in_range = set(range(1, train_max + 1))
        cells = [cell(_per_seed(sel, in_range))] + [
            cell(_per_seed(sel, {k * train_max})) for k in MULTIPLES]
        lines.append('| ' + ' | '.join([enc, seeds] + cells) + ' |')
      lines.append('')
  lines += generation_summary(rows)
  return '\n'.join(lines)


def diverged_note(rows: Sequence[dict]) -> list[str]:
  """A warning paragraph naming the diverged runs (none if none diverged)."""
  steps = {(r['task'], r['encoding'], r['seed']): r[DIVERGED] for r in rows
           if r.get(DIVERGED) is not None}
  if not steps:
    return []
  runs = '; '.join(f'{t} {e} seed {s} at step {d}' for (t, e, s), d in sorted(steps.items()))
  return [f'**{plural(len(steps), "run")} diverged** (training loss NaN or infinite; stopped there, '
          f'see each run\'s diverged.json): {runs}. They are left out of every mean below; '
          'the seeds column counts them.', '']


def coverage_summary(covered: Sequence[str], earlier: Sequence[str],
                     excluded: Sequence[tuple[str, str]]) -> list[str]:
  """Lines saying which runs (directories under the workdir) the tables
  cover: `covered`, of which `earlier` were not in this sweep but match its
  config, and which runs of the workdir were left out, and why."""
  lines = ['### Runs', '',
           f'These tables cover {plural(len(covered), "run")}, every run in this workdir '
           'trained and '
           'evaluated with the current config: ' + ', '.join(covered) + '.']
  if earlier:
    lines.append(f'{len(earlier)} of them {"is" if len(earlier) == 1 else "are"} not in this sweep (study.tasks/models/encodings/'
                 'seeds) but were trained with the same config earlier: '
                 + ', '.join(earlier) + '.')
  if excluded:
    lines.append('Left out: ' + '; '.join(f'{run} ({why})' for run, why in excluded) + '.')
  return lines + ['']


def generation_summary(rows: Sequence[dict]) -> list[str]:
  """Lines on how generation and teacher forcing agreed (none if not evaluated)."""
  scored = [r for r in rows if r.get('generation_agreement') is not None]
  if not scored:
    return []
  agreement = [r['generation_agreement'] for r in scored]
  worst = min(scored, key=lambda r: r['generation_agreement'])
  return [
      '### Greedy generation vs teacher forcing', '',
      'Every transformer was also scored by greedy autoregressive generation with '
      'the key/value cache. Exact match under generation must equal exact match '
      'under teacher forcing sequence by sequence; they agreed on '
      f'{100 * float(np.mean(agreement)):.3f}% of sequences on average over '
      f'{len(scored)} (model, length) cells, worst cell {100 * worst["generation_agreement"]:.2f}% '
      f'({worst["encoding"]}, seed {worst["seed"]}, length {worst["length"]}).', '']


def _buckets(train_max: int) -> list[tuple[str, set]]:
  """summary_markdown's columns as (name, lengths), relative to L_train."""
  return [('1–L', set(range(1, train_max + 1)))] + [
      (f'{k}×L', {k * train_max}) for k in MULTIPLES]


def comparison_markdown(rows_a: Sequence[dict], rows_b: Sequence[dict], *,
                        names: tuple[str, str], train_max: tuple[int, int]) -> str:
  """Two studies side by side: per task and metric, one line per (encoding,
  length bucket) cell with each study's mean ± std over seeds, and b − a in
  percentage points of the means. Buckets are summary_markdown's columns,
  each relative to its own study's L_train (`train_max`). A cell evaluated
  in one study only is flagged; one in neither is left out."""
  (a, b), (max_a, max_b) = names, train_max
  same = max_a == max_b
  lines = [f'## {b} against {a}', '',
           'Accuracy in percent, mean ± std over seeds and the worst seed\'s (seeds in '
           'brackets; one seed: its value); '
           f'{b} − {a} in percentage points of the means. Length buckets are '
           'those of summary.md: "1–L" averages every evaluated length up to '
           'L_train, "k×L" is the accuracy at exactly k × L_train '
           + (f'(L_train = {max_a} in both).' if same else
              f'(L_train = {max_a} in {a}, {max_b} in {b}: the buckets are at other lengths).'),
           '']
  header = ['encoding', 'lengths', a, b, f'{b} − {a}', 'note']
  # Step budgets that differ between entries or studies: named in the note.
  steps_a, steps_b = steps_by_entry(rows_a), steps_by_entry(rows_b)
  budget = lambda rows: {r[STEPS] for r in rows if r.get(STEPS)}
  if not steps_a and not steps_b and budget(rows_a) and budget(rows_b) and (
      budget(rows_a) != budget(rows_b)):  # one budget per study, not the same one
    steps_a, steps_b = ({r['encoding']: f'{r[STEPS]:,}' for r in x if r.get(STEPS)}
                        for x in (rows_a, rows_b))
  tasks = list(dict.fromkeys([r['task'] for r in rows_a] + [r['task'] for r in rows_b]))
  for task in tasks:
    sel_a = [r for r in rows_a if r['task'] == task]
    sel_b = [r for r in rows_b if r['task'] == task]
    encodings = list(dict.fromkeys([r['encoding'] for r in sel_a + sel_b]))
    for metric, title in (('token_accuracy', 'token accuracy'), ('exact_match', 'exact match')):
      lines += [f'### {task}: {title}', '', '| ' + ' | '.join(header) + ' |',
                '|' + '---|' * len(header)]
      for enc in encodings:
        va = [dict(r, value=r[metric]) for r in sel_a if r['encoding'] == enc]
        vb = [dict(r, value=r[metric]) for r in sel_b if r['encoding'] == enc]
        lost = [f'{name}: {seeds_cell(v)} seeds' for name, v in ((a, va), (b, vb))
                if split_diverged(v)[1]]
        lost += [f'{name}: {steps[enc]} steps' for name, steps in ((a, steps_a), (b, steps_b))
                 if enc in steps]
        (va, _), (vb, _) = split_diverged(va), split_diverged(vb)  # out of the means
        for (bucket, lengths_a), (_, lengths_b) in zip(_buckets(max_a), _buckets(max_b)):
          sa, sb = _per_seed(va, lengths_a), _per_seed(vb, lengths_b)
          if not sa and not sb:
            continue
          diff = f'{100 * (np.mean(sb) - np.mean(sa)):+.1f}' if sa and sb else '—'
          note = '; '.join(([] if sa and sb else [f'only in {a if sa else b}']) + lost)
          cells = [f'{cell(s)} ({len(s)})' if s else '—' for s in (sa, sb)]
          lines.append('| ' + ' | '.join([enc, bucket, *cells, diff, note]) + ' |')
      lines.append('')
  return '\n'.join(lines)


def ceiling_markdown(rows: Sequence[dict], train_max: int) -> str:
  """Per task, a table: k × (training range, 2×, 4×, 8× L_train), each cell
  the percentage of evaluation strings a k-gram lookup can copy
  (`evaluate.ambiguity`)."""
  if not rows:
    return ''
  lengths = sorted({r['length'] for r in rows})
  columns = [(f'1–L ({train_max})', [n for n in lengths if n <= train_max])] + [
      (f'{m}×L ({m * train_max})', [m * train_max]) for m in MULTIPLES
      if m * train_max in lengths]
  lines = ['### The task\'s own ceiling: strings a k-gram lookup can copy', '',
           'Percent of the evaluation strings (the same strings every model above was '
           'scored on) in which no k tokens occur before two outputs with different next '
           'tokens: for copy and reverse, strings with no repeated k-gram. A model that '
           'copies by finding its last k outputs in the input can get at most these exact; '
           'one above the row of k uses longer contexts (evaluate/ambiguity.py).', '']
  for task in sorted({r['task'] for r in rows}):
    sel = [r for r in rows if r['task'] == task]
    lines += [f'#### {task}', '', '| k | ' + ' | '.join(c for c, _ in columns) + ' |',
              '|' + '---|' * (len(columns) + 1)]
    for k in sorted({r['k'] for r in sel}):
      cells = []
      for _, ns in columns:
        values = [r['unambiguous'] for r in sel if r['k'] == k and r['length'] in ns]
        cells.append(f'{100 * np.mean(values):.1f}' if values else '—')
      lines.append(f'| {k} | ' + ' | '.join(cells) + ' |')
    lines.append('')
  return '\n'.join(lines)


def k_cell(cell: Sequence[dict]) -> str:
  """The mean k of a failures cell's ambiguity failures: an int when it is
  one, '—' when no string failed on an ambiguity (no k to average)."""
  ks = [r['mean_k_ambiguity'] for r in cell if r['ambiguity'] > 0]
  return number(float(np.mean(ks))) if ks else '—'


def failures_markdown(rows: Sequence[dict], train_max: int) -> str:
  """Per task, a table: (encoding, length) × how the strings end, percent of
  all strings, mean over seeds."""
  kinds = FAILURE_FIELDS[4:9]
  lines = ['# How the strings fail', '',
           'Percent of the evaluation strings, mean over seeds, by how each ends: copied '
           'exactly, or its first wrong token (the same under teacher forcing and greedy '
           'generation) is an *ambiguity* (the token that follows another earlier occurrence '
           'of the last k >= 2 tokens: a repeated k-gram; "k" is their mean k), an *early '
           'EOS*, a *missed EOS* (another token where EOS was due) or *drift* (none of '
           'these). The ceilings: strings with no repeated 3-gram, 4-gram '
           f'(evaluate/ambiguity.py). L_train = {train_max}.', '']
  header = ['encoding', 'length', 'seeds', *kinds, 'k', '3-gram ceiling', '4-gram ceiling']
  for task in sorted({r['task'] for r in rows}):
    lines += [f'## {task}', '', '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    sel = [r for r in rows if r['task'] == task]
    for enc in dict.fromkeys(r['encoding'] for r in sel):
      for n in sorted({r['length'] for r in sel if r['encoding'] == enc}):
        cell = [r for r in sel if r['encoding'] == enc and r['length'] == n]
        mean = lambda key: float(np.mean([r[key] for r in cell]))
        cells = [f'{100 * mean(k):.1f}' for k in kinds] + [
            k_cell(cell), f'{100 * mean("ceiling_3"):.1f}',
            f'{100 * mean("ceiling_4"):.1f}']
        lines.append('| ' + ' | '.join([enc, str(n), str(len(cell)), *cells]) + ' |')
    lines.append('')
  return '\n'.join(lines)
