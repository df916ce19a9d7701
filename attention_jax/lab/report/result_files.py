"""The result files: results.csv's schema, the other tables' (ceiling,
failures), and their reading and writing, every write atomic (a temporary
file renamed over the old one), so a kill mid-write never leaves half a file.
"""

import csv
import os
from typing import Iterable, Sequence

FIELDS = ('task', 'encoding', 'seed', 'length', 'token_accuracy', 'exact_match',
          'generated_exact_match', 'generation_agreement', 'config_hash', 'version',
          'diverged_at', 'num_steps', 'hard_exact_match')
PROVENANCE = ('config_hash', 'version')  # added in 0.1.0; older files lack them
# Only when evaluated by generation (empty otherwise; older files lack them).
GENERATION = ('generated_exact_match', 'generation_agreement')
# The step at which the run's training loss became non-finite (`train.divergence`);
# empty for a run that did not diverge (older files lack the column).
DIVERGED = 'diverged_at'
# The run's train.num_steps: entries of one table may have had different
# budgets (a variant's own), which the tables then show (older files lack it).
STEPS = 'num_steps'
# Exact match on the length's hard cases (`evaluate.hard`), count-weighted
# over its cases; empty where the task has none or the run was not scored
# on them (older files lack the column).
HARD = 'hard_exact_match'
OPTIONAL = GENERATION + (DIVERGED, STEPS, HARD)


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically: a temporary file renamed over it, so
  a kill mid-write leaves the old file (or none), never half of the new one."""
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def write_rows(path: str, rows: Iterable[dict]) -> None:
  """Writes `rows` to `path` atomically (a partial file is never left)."""
  tmp = path + '.tmp'
  with open(tmp, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=FIELDS, lineterminator='\n')
    writer.writeheader()
    for row in rows:
      writer.writerow({k: _blank(row.get(k)) if k in OPTIONAL else row[k] for k in FIELDS})
  os.replace(tmp, path)


def _blank(value):
  return '' if value is None else value


def read_rows(path: str) -> list[dict]:
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    for field in PROVENANCE:  # files written before these columns existed
      row.setdefault(field, 'unknown')
    for field in GENERATION + (HARD,):
      value = row.setdefault(field, '')
      row[field] = float(value) if value not in ('', None) else None
    for field in (DIVERGED, STEPS):
      value = row.setdefault(field, '')
      row[field] = int(value) if value not in ('', None) else None
    if row.keys() != set(FIELDS):
      raise ValueError(f'{path}: columns {sorted(row)} are not the schema {list(FIELDS)}.')
    row['seed'], row['length'] = int(row['seed']), int(row['length'])
    row['token_accuracy'] = float(row['token_accuracy'])
    row['exact_match'] = float(row['exact_match'])
  return rows


CEILING_FIELDS = ('task', 'length', 'k', 'unambiguous')


def write_table(path: str, fields: Sequence[str], rows: Iterable[dict]) -> None:
  """`rows` (dicts holding at least `fields`) to `path` as CSV, atomically."""
  tmp = path + '.tmp'
  with open(tmp, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=fields, lineterminator='\n')
    writer.writeheader()
    writer.writerows({k: row[k] for k in fields} for row in rows)
  os.replace(tmp, path)


def read_table(path: str, fields: Sequence[str], types: dict, what: str) -> list[dict]:
  """A table `write_table` wrote: its rows with the columns in `types` parsed
  (column -> int or float); a ValueError names a damaged file and `what` it
  should have been."""
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  try:
    return [dict(r, **{k: parse(r[k]) for k, parse in types.items()}) for r in rows]
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f'{path}: not {what} ({tuple(fields)}): {e}') from None


def write_ceiling(path: str, rows: Iterable[dict]) -> None:
  """`ambiguity.ceiling_rows`' rows to `path` (CSV), atomically."""
  write_table(path, CEILING_FIELDS, rows)


FAILURE_FIELDS = ('task', 'encoding', 'seed', 'length', 'exact', 'ambiguity', 'early EOS',
                  'missed EOS', 'drift', 'mean_k_ambiguity', 'ceiling_3', 'ceiling_4')


def write_failures(path: str, rows: Iterable[dict]) -> None:
  """`evaluate.failure_rows`' rows (with task, encoding, seed) to `path`, atomically."""
  write_table(path, FAILURE_FIELDS, rows)
