"""`config.protocol` chooses the benchmark (`runs.benchmarks`): a decoder
config runs the study, an encoder config DeepMind's suite, whichever entry
point is given it; a suite workdir written when the field was `kind` is read
as today's."""

import json
import os
import tempfile

from absl.testing import absltest

from attention_jax.lab.config import presets
from attention_jax.lab.config import suite_config
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.runs import benchmarks
from attention_jax.lab.train import divergence
from configs import chomsky as chomsky_config
from configs import copy as copy_config


def _report_only(config):
  config.study.report_only = True  # nothing trains: each benchmark says what it lacks
  return config


class BenchmarkByProtocolTest(absltest.TestCase):

  def test_the_protocol_chooses_the_benchmark(self):
    # Each benchmark names its own unit (the study's runs, the suite's
    # settings) in refusing an unfinished workdir.
    for config, unit in ((copy_config.get_config('scale=tiny'), r'runs are not finished'),
                         (chomsky_config.get_config('scale=tiny'),
                          r'settings are not recorded yet')):
      workdir = tempfile.mkdtemp()
      with self.assertRaisesRegex(ConfigError, rf'^study.report_only: \d+ of .*{unit}'):
        benchmarks.run_benchmark(_report_only(config), workdir, log=lambda _: None)
      self.assertEqual(os.listdir(workdir), [])

  def test_every_protocol_has_a_benchmark_and_a_preset(self):
    self.assertEqual(set(benchmarks.BENCHMARKS), set(presets.PROTOCOLS))
    self.assertEqual(set(presets.FIELDS_OF), set(presets.PROTOCOLS))
    for protocol, preset in presets.FIELDS_OF.items():
      self.assertEqual(presets.protocol_of(presets._load(preset)), protocol)

  def test_a_protocol_outside_the_table_is_refused_before_anything_runs(self):
    config = chomsky_config.get_config('scale=tiny')
    config.protocol = 'seq2seq'
    with self.assertRaisesRegex(ConfigError, r"protocol='seq2seq'; choose from "
                                             r"\('decoder', 'encoder'\)"):
      benchmarks.run_benchmark(config, tempfile.mkdtemp(), log=lambda _: None)

  def test_a_config_of_the_other_protocols_fields_is_refused_before_anything_runs(self):
    # A file that takes one protocol's preset and names the other protocol.
    for config, protocol, other in ((chomsky_config.get_config('scale=tiny'), 'decoder', 'encoder'),
                                    (copy_config.get_config('scale=tiny'), 'encoder', 'decoder')):
      config.protocol = protocol
      workdir = tempfile.mkdtemp()
      with self.assertRaisesRegex(
          ConfigError, rf"^invalid config: protocol='{protocol}', but its fields are the "
                       rf"{other} protocol's \(\d+ of configs/\w+.py's own: "):
        benchmarks.run_benchmark(config, workdir, log=lambda _: None)
      self.assertEqual(os.listdir(workdir), [])

  def test_a_suite_workdir_of_the_older_field_kind_is_the_same_config(self):
    config = chomsky_config.get_config('scale=tiny')
    stored = suite_config.identity(config)
    stored.pop('protocol')
    stored['kind'] = 'chomsky'  # what the suite's config once had instead
    workdir = tempfile.mkdtemp()
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump({'identity': stored}, f)
    suite_config.check_workdir(config, workdir)  # no mismatch
    config.protocol = 'decoder'
    with self.assertRaisesRegex(ConfigError, r'\(differing: protocol\)'):
      suite_config.check_workdir(config, workdir)

  def test_show_prints_the_summary_and_figures_and_returns_the_exit_status(self):
    workdir = tempfile.mkdtemp()
    summary = os.path.join(workdir, 'summary.md')
    with open(summary, 'w') as f:
      f.write('| table |')
    self.assertEqual(benchmarks.show(None), 0)  # a shard whose outputs wait
    self.assertEqual(benchmarks.show(benchmarks.Finished(summary, (summary,), None)), 0)
    self.assertEqual(benchmarks.show(benchmarks.Finished(summary, (), 'error: diverged')),
                     divergence.DIVERGED)


if __name__ == '__main__':
  absltest.main()
