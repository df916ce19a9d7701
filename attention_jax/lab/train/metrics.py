"""Per-step metrics: `metrics.jsonl` always, TensorBoard event files optionally.

TensorBoard files are written with tensorboardX, which needs no TensorFlow.
Only process 0 writes. On resume the JSON lines of steps at or after the
resumed step are dropped first, so the file never holds a step twice, and so
is a last line cut short by a kill mid-write (its step is recomputed).
"""

import json
import os
from typing import Optional

import jax


def _step(line: str) -> float:
  """The step of one JSON line; infinity for a line that does not parse (the
  last one, cut short), so that it is dropped with the steps to redo."""
  try:
    return json.loads(line)['step']
  except (json.JSONDecodeError, KeyError, TypeError):
    return float('inf')


class MetricsWriter:

  def __init__(self, workdir: Optional[str], *, start_step: int, tensorboard: bool,
               config_json: str):
    """`config_json` goes into TensorBoard's text tab (the run's config.json
    is written by `lab.config.identity.claim`)."""
    self.enabled = bool(workdir) and jax.process_index() == 0
    self.jsonl = self.tb = None
    if not self.enabled:
      return
    path = os.path.join(workdir, 'metrics.jsonl')
    kept = []
    if start_step and os.path.exists(path):
      with open(path) as f:
        kept = [line.rstrip('\n') + '\n' for line in f if _step(line) < start_step]
    # The kept lines replace the file at once (a kill meanwhile leaves the old
    # one), then new lines are appended.
    with open(path + '.tmp', 'w') as f:
      f.writelines(kept)
    os.replace(path + '.tmp', path)
    self.jsonl = open(path, 'a')
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self.tb = SummaryWriter(os.path.join(workdir, 'tensorboard'), purge_step=start_step)
      if not start_step:
        self.tb.add_text('config', '```\n' + config_json + '\n```', 0)

  def write(self, row: dict) -> None:
    if not self.enabled:
      return
    self.jsonl.write(json.dumps(row) + '\n')
    if self.tb:
      for key, value in row.items():
        if key != 'step':
          self.tb.add_scalar(f'train/{key}', value, row['step'])

  def flush(self) -> None:
    """Puts the lines written so far on disk: called before each checkpoint,
    so that no step a checkpoint covers can be missing from the file."""
    if self.jsonl:
      self.jsonl.flush()

  def close(self) -> None:
    if self.jsonl:
      self.jsonl.close()
    if self.tb:
      self.tb.close()
