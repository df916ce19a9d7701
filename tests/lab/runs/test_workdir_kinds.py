"""A workdir holds one kind of run: every writer (the decoder study,
DeepMind's suite, experiments.train's one run) refuses a workdir another
one made, before writing anything, and the readers (the follow-up tools,
`trained.load`) name a suite's workdir instead of failing inside it."""

import json
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import trained
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs import workdir_checks
from attention_jax.lab.runs import workdirs
from attention_jax.lab.runs.one_run import run_one
from attention_jax.lab.runs.study import run_study
from attention_jax.lab.runs.suite import run_suite
from configs import chomsky as chomsky_config
from configs import copy as copy_config


def _made(kind: str) -> str:
  """A workdir as `kind`'s writer leaves it (the files that say what it is)."""
  path = tempfile.mkdtemp()
  config = copy_config.get_config('scale=tiny').to_json()
  if kind == 'study':
    os.makedirs(os.path.join(path, 'copy', 'rope', 'seed0'))
    with open(os.path.join(path, 'copy', 'rope', 'seed0', 'config.json'), 'w') as f:
      f.write(config)
    open(os.path.join(path, 'results.csv'), 'w').close()
  elif kind == 'suite':
    os.makedirs(os.path.join(path, 'settings', 'parity_check'))
    with open(os.path.join(path, 'config.json'), 'w') as f:
      json.dump({'identity': {}}, f)
  else:
    with open(os.path.join(path, 'config.json'), 'w') as f:
      f.write(config)
    open(os.path.join(path, 'metrics.jsonl'), 'w').close()
  return path


def _listing(path):
  return sorted(os.path.join(d, n) for d, dirs, files in os.walk(path) for n in dirs + files)


WRITERS = {
    'study': lambda w: run_study(copy_config.get_config('scale=tiny'), w, log=lambda _: None),
    'suite': lambda w: run_suite(chomsky_config.get_config('scale=tiny'), w,
                                 progress=lambda _: None),
    'run': lambda w: run_one(copy_config.get_config('scale=tiny'), w),
}


class WorkdirKindsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f'{writer}_in_{holder}', writer, holder)
      for writer in WRITERS for holder in WRITERS if writer != holder)
  def test_workdir_kinds_each_writer_refuses_another_kind(self, writer, holder):
    path = _made(holder)
    self.assertEqual(workdir_checks.held(path), holder)
    before = _listing(path)
    with self.assertRaisesRegex(
        ConfigError, rf'holds {workdir_checks.MADE_BY[holder]}; this command writes '
                     rf'{workdir_checks.MADE_BY[writer]}, whose results.csv'.replace('(', r'\(')
                     .replace(')', r'\)')):
      WRITERS[writer](path)
    self.assertEqual(_listing(path), before)

  def test_workdir_kinds_a_new_or_empty_folder_is_none(self):
    self.assertIsNone(workdir_checks.held(os.path.join(tempfile.mkdtemp(), 'new')))
    self.assertIsNone(workdir_checks.held(tempfile.mkdtemp()))

  def test_workdir_kinds_readers_name_a_suite_workdir(self):
    path = _made('suite')
    with self.assertRaisesRegex(ConfigError, r"holds DeepMind's suite \(a config of protocol 'encoder'\): "
                                r'its results are the results.csv'):
      workdirs.kind(path)
    with self.assertRaisesRegex(ConfigError, r"holds DeepMind's suite .* load a run of a "
                                'decoder study or of experiments.train'):
      trained.load(path)


if __name__ == '__main__':
  absltest.main()
