"""Per-step metrics: `metrics.jsonl` always, TensorBoard event files optionally.

TensorBoard files are written with tensorboardX, which needs no TensorFlow.
Only process 0 writes. On resume the JSON lines of steps at or after the
resumed step are dropped first, so the file never holds a step twice.
"""

import json
import os
from typing import Optional

import jax


class MetricsWriter:

  def __init__(self, workdir: Optional[str], *, start_step: int, tensorboard: bool,
               config_json: str):
    self.enabled = bool(workdir) and jax.process_index() == 0
    self.jsonl = self.tb = None
    if not self.enabled:
      return
    path = os.path.join(workdir, 'metrics.jsonl')
    kept = []
    if start_step and os.path.exists(path):
      with open(path) as f:
        kept = [line for line in f if json.loads(line)['step'] < start_step]
    self.jsonl = open(path, 'w')
    self.jsonl.writelines(kept)
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config_json)  # the hyperparameters, once per run
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

  def close(self) -> None:
    if self.jsonl:
      self.jsonl.close()
    if self.tb:
      self.tb.close()
