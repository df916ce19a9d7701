"""The hard set in summary.md: which seeds get every hard case right, case
by case, and where each seed that does not first fails.

`summary_markdown` already shows the hard cases' exact match per length
bucket beside the uniform columns (`result_files.HARD`); these tables add what a
mean hides: a claim like "adds 40-digit numbers" holds for a seed only if
that seed is exact on every hard case, so each is counted per seed.
Diverged runs are left out (the seeds columns say how many).
"""

from typing import Sequence

from attention_jax.lab.report import result_files
from attention_jax.lab.report import results


def per_length(hard_rows: Sequence[dict]) -> dict:
  """{(task, encoding, seed, length): exact match over the length's hard
  cases, weighted by their counts} of hard.csv rows."""
  totals: dict = {}
  for r in hard_rows:
    key = (r['task'], r['encoding'], r['seed'], r['length'])
    right, count = totals.get(key, (0.0, 0))
    totals[key] = (right + r['exact_match'] * r['count'], count + r['count'])
  return {k: right / count for k, (right, count) in totals.items() if count}


def with_hard(rows: Sequence[dict], hard_rows: Sequence[dict]) -> list[dict]:
  """results.csv `rows` with `result_files.HARD` filled in from `hard_rows`
  (None where a run has no hard score at that length)."""
  scores = per_length(hard_rows)
  return [dict(r, **{result_files.HARD: scores.get(
      (r['task'], r['encoding'], r['seed'], r['length']))}) for r in rows]


def _diverged(rows: Sequence[dict]) -> set:
  return {(r['task'], r['encoding'], r['seed']) for r in rows
          if r.get(result_files.DIVERGED) is not None}


def hard_markdown(hard_rows: Sequence[dict], rows: Sequence[dict] = ()) -> str:
  """Per task with hard rows: per encoding, the seeds exact on every hard
  case (and the overall exact match, mean ± std, worst seed); per encoding
  and case, how many seeds are exact on every input of the case; and for
  each seed that is not, its shortest failing length and the cases failed
  there. `rows` (results.csv's) mark the diverged runs, left out."""
  if not hard_rows:
    return ''
  lost = _diverged(rows)
  kept = [r for r in hard_rows if (r['task'], r['encoding'], r['seed']) not in lost]
  lines = []
  for task in sorted({r['task'] for r in hard_rows}):
    sel = [r for r in kept if r['task'] == task]
    encodings = list(dict.fromkeys(r['encoding'] for r in hard_rows if r['task'] == task))
    cases = list(dict.fromkeys(r['case'] for r in sel))
    lengths = sorted({r['length'] for r in sel})
    span = f'{lengths[0]}–{lengths[-1]}' if lengths else '—'
    lines += [f'### {task}: hard cases, per seed', '',
              f'Every hard case at every evaluated length ({span}; tasks/hard_cases.py). '
              '"exact on all": seeds that get every hard input right; the next column is the '
              'exact match over all of them, mean ± std over seeds and the worst seed\'s. '
              'Diverged runs are left out.', '',
              '| encoding | exact on all | all hard inputs |', '|---|---|---|']
    by_seed = {}
    for enc in encodings:
      seeds = sorted({r['seed'] for r in sel if r['encoding'] == enc})
      for seed in seeds:
        mine = [r for r in sel if r['encoding'] == enc and r['seed'] == seed]
        right = sum(r['exact_match'] * r['count'] for r in mine)
        by_seed[enc, seed] = (right / sum(r['count'] for r in mine), mine)
      scores = [by_seed[enc, s][0] for s in seeds]
      perfect = sum(score == 1.0 for score in scores)
      dropped = len({r['seed'] for r in hard_rows if r['task'] == task and r['encoding'] == enc
                     and (task, enc, r['seed']) in lost})
      note = f' ({dropped} diverged, left out)' if dropped else ''
      lines.append(f'| {enc} | {perfect} of {len(seeds)}{note} | '
                   f'{results.cell(scores)} |')
    lines += ['', 'Seeds exact on every input of each case, at every length:', '',
              '| encoding | ' + ' | '.join(cases) + ' |', '|' + '---|' * (len(cases) + 1)]
    for enc in encodings:
      seeds = sorted({s for e, s in by_seed if e == enc})
      cells = []
      for case in cases:
        ok = sum(all(r['exact_match'] == 1.0 for r in by_seed[enc, s][1] if r['case'] == case)
                 for s in seeds)
        cells.append(f'{ok}/{len(seeds)}')
      lines.append(f'| {enc} | ' + ' | '.join(cells) + ' |')
    failing = [(enc, seed) for (enc, seed), (score, _) in by_seed.items() if score < 1.0]
    if failing:
      lines += ['', 'Where each seed that is not exact on all first fails (its shortest length '
                'with a wrong hard input, the cases wrong there, and how many longer lengths '
                'also fail):', '',
                '| encoding | seed | first failing length | cases wrong there | longer lengths '
                'failing |', '|---|---|---|---|---|']
      for enc, seed in failing:
        mine = by_seed[enc, seed][1]
        bad = sorted({r['length'] for r in mine if r['exact_match'] < 1.0})
        first = bad[0]
        wrong = list(dict.fromkeys(r['case'] for r in mine
                                   if r['length'] == first and r['exact_match'] < 1.0))
        later = len(bad) - 1
        total = len([n for n in {r['length'] for r in mine} if n > first])
        lines.append(f'| {enc} | {seed} | {first} | {", ".join(wrong)} | '
                     f'{later} of {total} |')
    lines.append('')
  return '\n'.join(lines)

