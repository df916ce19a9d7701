"""Timing side by side, as every benchmark here does it.

* `interleaved`: the calls of one comparison alternate A B C … A B C …, so
  that a change in the machine's speed (another process, the clock) falls on
  each of them alike; medians and min–max from `stats`, ratios to a baseline
  from `ratios`.
* `run_child` / `emit`: one configuration per process, where peak resident
  memory (ru_maxrss, `peak_rss_mib`) must be that configuration's alone. The
  child prints one `RESULT {json}` line; a child that fails becomes a row
  with its last error line, so one failed size does not lose the others.
"""

import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, Mapping, Sequence

import jax


def interleaved(calls: Mapping[str, Callable[[], object]], repeats: int, *,
                warm_up: bool = True) -> dict[str, list[float]]:
  """Seconds of each call, `repeats` times each, alternating between them.

  Args:
    calls: name -> a call with no arguments; its result is waited for
      (`jax.block_until_ready`), so asynchronous dispatch is timed in full.
    repeats: timed calls per name.
    warm_up: one untimed call of each first (compilation, allocation); False
      where the caller has already made one.

  Returns:
    name -> the `repeats` wall times, in call order.
  """
  if warm_up:
    for call in calls.values():
      jax.block_until_ready(call())
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      times[name].append(time.perf_counter() - start)
  return times


def stats(seconds: Sequence[float]) -> dict:
  """`median_s`, `min_s` and `max_s` of one call's times."""
  return dict(median_s=statistics.median(seconds), min_s=min(seconds), max_s=max(seconds))


def ratios(times: Mapping[str, Sequence[float]], baseline: str) -> dict[str, float]:
  """name -> its median over the baseline's median (below 1: faster)."""
  base = statistics.median(times[baseline])
  return {name: statistics.median(ts) / base for name, ts in times.items()}


def peak_rss_mib() -> float:
  """This process's peak resident memory so far, MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def emit(row: dict) -> None:
  """A child's result, the one line `run_child` reads."""
  print('RESULT ' + json.dumps(row), flush=True)


def run_child(module: str, flags: Sequence[str], **identity) -> dict:
  """Runs `python -m module *flags` and returns the row it `emit`ted, or
  `identity` with `error` (the child's last stderr line) where it failed."""
  proc = subprocess.run([sys.executable, '-m', module, *flags], capture_output=True, text=True)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  if proc.returncode or not lines:
    return dict(identity, error=proc.stderr.strip().splitlines()[-1:])
  return json.loads(lines[0][len('RESULT '):])
