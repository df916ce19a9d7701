"""Writing a benchmark's results (raw JSON plus a Markdown table) and timing
its rows side by side."""

import json
import os
import time


def write_report(out_dir: str, name: str, payload, table_lines: list[str]) -> None:
  """`out_dir/name.json` (the payload) and `out_dir/name.md` (the table), and
  the table on stdout."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f'{name}.json'), 'w') as f:
    json.dump(payload, f, indent=1)
  with open(os.path.join(out_dir, f'{name}.md'), 'w') as f:
    f.write('\n'.join(table_lines) + '\n')
  print('\n'.join(table_lines))


def interleaved_times(runs: dict, repeats: int) -> dict[str, list[float]]:
  """{name: seconds of each of `repeats` calls} of the no-argument callables
  `runs` (each blocking until its work is done), after one warm-up call each
  (compilation), timed interleaved A B A B … so that a change in the
  machine's load falls on every row alike."""
  for run in runs.values():
    run()
  times = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      run()
      times[name].append(time.perf_counter() - start)
  return times
