"""Every bad command line or config is one line on stderr, exit status 2,
and nothing written: absl's flag parsing (command_line.parse_flags,
checked in-process on fresh FlagValues), the config checks
(validate_config) and the run's own failures (process.entry_point). Two
subprocesses check the wiring of the real entry points.
"""

import contextlib
import io
import logging
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import ml_collections
from absl import flags
from absl.testing import absltest
import pytest
from absl.testing import parameterized

from attention_jax.lab.config import presets
from attention_jax.lab.config import command_line
from attention_jax.lab.runs import process
from attention_jax.lab.train.interrupt import TrainingInterrupted
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config.validate import validate_config
from tests.lab.configs import exit_line
from tests.lab.configs import with_fields
from configs import copy as copy_config

ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY = '--config=configs/copy.py:scale=tiny'



def _flags():
  """The flags an entry point defines, on fresh FlagValues."""
  flag_values = flags.FlagValues()
  presets.DEFINE_config_file('config', 'copy', 'Run configuration.', flag_values=flag_values)
  flags.DEFINE_string('workdir', 'runs/x', 'Where outputs are written.', flag_values=flag_values)
  return flag_values


def _leaves(config, prefix=''):
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def _parse(*args):
  flag_values = _flags()
  rest = command_line.parse_flags(['prog', *args], flag_values)
  return flag_values, rest


class ParseFlagsTest(parameterized.TestCase):
  """The command line, in-process: the same parse as `app.run`'s."""

  @parameterized.named_parameters(
      ('unknown_field', ('--config.train.batchsize=4',),
       r"^error: --config.train.batchsize: train has no field 'batchsize'; did you mean "
       r'train.batch_size\? its fields: adam_b1, .*weight_decay\.$'),
      ('unknown_field_default_config', ('--config.model.dmodel=8',),
       r"model has no field 'dmodel'; did you mean model.d_model\?"),
      ('unknown_group', ('--config.trian.seed=1',), r"the config has no field 'trian'; did you "
       r'mean train\? its fields: .*deterministic_gpu.*'),
      ('int_given_text', ('--config.train.batch_size=abc',),
       r'^error: --config.train.batch_size=abc: train.batch_size takes int values '
       r"\(invalid literal for int\(\) with base 10: 'abc'\)\.$"),
      ('int_given_float', ('--config.train.num_steps=2.5',),
       r"num_steps=2.5: train.num_steps takes int values .*'2.5'"),
      ('preset_typo', ('--config=configs/copy.py:scale=tny',),
       r"^error: --config=configs/copy.py:scale=tny: scale='tny': choose cpu, paper, tiny"),
      ('preset_typo_with_override', ('--config=configs/copy.py:scale=tny',
                                     '--config.train.seed=1'), r"scale='tny': choose cpu"),
      ('study_preset_typo', ('--config=configs/copy.py:study=fronteir',),
       r"study='fronteir': choose default, extended, frontier, all, generalize"),
      ('the_older_size_preset', ('--config=configs/copy.py:size=tiny',),
       r"size= is now scale= \(cpu, paper, tiny\) or study= \(generalize, all, frontier\)"),
      ('unknown_flag', ('--wokdir=x',), r"^error: Unknown command line flag 'wokdir'"),
      ('whole_group_of_an_unlisted_encoding', (TINY, '--config.model.encoding_options.rope={}'),
       r"'rope' has no options in the config yet; set them one at a time, "
       r'--config.model.encoding_options.rope.OPTION=VALUE'),
      ('option_without_value', (TINY, '--config.model.encoding_options.rope.base'),
       r'encoding_options.rope.base needs a value: .*=VALUE'),
      ('the_protocol', (TINY, '--config.protocol=encoder'),
       r"^error: --config.protocol=encoder: the protocol is the config file's own \(its fields "
       r"are that protocol's\), not an override; run a config of the protocol instead: "
       r'decoder: addition, copy, flipflop, seq2seq; encoder: chomsky\.$'),
  )
  def test_bad_command_line_is_one_line(self, args, message):
    self.assertRegex(exit_line(lambda: _parse(*args)), message)

  def test_options_of_an_encoding_the_config_does_not_list(self):
    flag_values, rest = _parse(TINY, '--config.model.encoding_options.rope.base=500',
                               '--config.model.encoding_options.hard_alibi.num_windowed_heads=2',
                               '--config.model.encoding_options.t5.num_buckets=8', 'extra')
    self.assertEqual(rest, ['prog', 'extra'])
    options = flag_values['config'].value.model.encoding_options
    self.assertEqual(options.rope.to_dict(), {'base': 500})  # a group of its own
    self.assertEqual(options.hard_alibi.to_dict(), {'widths': (1, 2), 'num_windowed_heads': 2})
    self.assertEqual(options.t5.to_dict(), {'num_buckets': 8})  # the rest: build's defaults
    self.assertEqual(options.windowed_rope.window, 2)  # the other encodings keep theirs
    self.assertTrue(options.is_locked)
    c = flag_values['config'].value
    c.model.encoding = 'rope'
    validate_config(c)  # rope's build takes `base`

  def test_an_option_the_encoding_does_not_take_is_refused_by_validation(self):
    flag_values, _ = _parse(TINY, '--config.model.encoding_options.rope.bsae=5')
    with self.assertRaisesRegex(ConfigError, r"encoding_options.rope.bsae: 'rope' takes \['base'\]"):
      validate_config(flag_values['config'].value)

  def test_option_values_are_typed_as_written(self):
    flag_values, _ = _parse(TINY, '--config.model.encoding_options.learned.stddev=0.5',
                            '--config.model.encoding_options.learned.check_positions=false',
                            '--config.model.encoding_options.sinusoidal.base', 'x1')
    options = flag_values['config'].value.model.encoding_options
    self.assertEqual(options.learned.to_dict(), {'stddev': 0.5, 'check_positions': False})
    self.assertEqual(options.sinusoidal.base, 'x1')

  def test_overrides_without_config_flag_apply_to_the_default(self):
    flag_values, _ = _parse('--config.train.seed=7')
    self.assertEqual(flag_values['config'].value.train.seed, 7)
    self.assertEqual(flag_values['config'].value.train.num_steps, 2000)  # the default preset's

  @parameterized.parameters('copy:scale=tiny,encoding=rope', 'addition:scale=tiny',
                            'flipflop:scale=tiny', 'seq2seq:scale=tiny')
  def test_every_field_without_a_default_value_takes_an_override(self, preset):
    # ml_collections cannot override a field holding a bare None: such a
    # field must be a typed placeholder, kept through the presets.
    config = _parse(f'--config={preset}')[0]['config'].value
    unset = [path for path, value in _leaves(config) if value is None]
    self.assertNotEmpty(unset)
    for path in unset:
      flag_values, _ = _parse(f'--config={preset}', f'--config.{path}=rope/4,none')
      value = flag_values['config'].value
      for key in path.split('.'):
        value = value[key]
      self.assertEqual(value, 'rope/4,none', path)

  def test_workdir_that_is_a_file_or_read_only(self):
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, 'file')
    pathlib.Path(path).write_text('x')
    self.assertRegex(exit_line(lambda: _parse(TINY, f'--workdir={path}')),
                     rf"^error: --workdir='{path}' is a file; it must be a folder")
    self.assertRegex(exit_line(lambda: _parse(TINY, f'--workdir={path}/sub')),
                     rf"'{path}' is a file, so the folder cannot be made")
    read_only = os.path.join(folder, 'read_only')
    os.mkdir(read_only, 0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere: ask a read-only mount instead
      read_only = '/proc/sys'
    if os.access(read_only, os.W_OK):
      self.skipTest('no read-only folder to test with')
    self.assertRegex(exit_line(lambda: _parse(TINY, f'--workdir={read_only}/new/run')),
                     rf"'{read_only}' is not writable")
    _parse(TINY, f'--workdir={folder}/new/run')  # a writable parent is enough
    self.assertFalse(os.path.exists(f'{folder}/new'))

  def test_workdir_that_cannot_be_made(self):
    self.assertEqual(exit_line(lambda: _parse(TINY, '--workdir=')),
                     "error: --workdir='' is empty; name the folder to write into, e.g. "
                     '--workdir=runs/study.')
    # A virtual filesystem passes root's permission check but makes no folder.
    self.assertRegex(exit_line(lambda: _parse(TINY, '--workdir=/proc/no_such/run')),
                     r"^error: --workdir='/proc/no_such/run' cannot be written \(.+, under "
                     r"'/proc'\); choose a folder you can write to\.$")
    existing = tempfile.mkdtemp()
    _parse(TINY, f'--workdir={existing}')  # an existing folder: probed, left as it was
    self.assertEqual(os.listdir(existing), [])

  def test_config_file_without_get_config_is_one_line(self):
    # ml_collections loads every file as one module name: without the check,
    # the file would inherit the default preset's get_config and train that.
    path = os.path.join(tempfile.mkdtemp(), 'no_get_config.py')
    pathlib.Path(path).write_text('X = 1\n')
    for extra in ((), ('--config.train.seed=1',)):
      self.assertEqual(exit_line(lambda: _parse(f'--config={path}', *extra)),
                       f'error: --config={path}: {path} defines no get_config(); a config '
                       'file defines get_config() (or get_config(arg) for --config=FILE:arg) '
                       'returning an ml_collections.ConfigDict.')

  def test_a_study_refuses_the_single_runs_encoding_flag(self):
    with self.assertRaisesRegex(ConfigError, r'^--config.model.encoding=xpos names the encoding '
                                r'of one run \(experiments.train\); a study trains '
                                r'study.encodings: --config.study.encodings="\(\'xpos\',\)", '
                                r'or the preset --config=copy:encoding=xpos\.$'):
      command_line.check_study_overrides(['prog', TINY, '--config.model.encoding=xpos'])
    command_line.check_study_overrides(['prog', TINY, '--config.study.encodings=("xpos",)'])

  def test_config_file_with_a_syntax_error_is_one_line(self):
    path = os.path.join(tempfile.mkdtemp(), 'broken.py')
    pathlib.Path(path).write_text('import ml_collections\n\ndef get_config(:\n  return 1\n')
    for extra in ((), ('--config.train.seed=1',)):  # read by absl, or by parse_flags first
      self.assertEqual(exit_line(lambda: _parse(f'--config={path}', *extra)),
                       f'error: --config={path}: {path}, line 3: invalid syntax (a syntax '
                       'error in the config file).')


def _config(**overrides):
  return with_fields(copy_config.get_config('scale=tiny'), **overrides)


class ValidateTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('no_encodings', dict(study__encodings=()), 'study.encodings is empty'),
      ('no_tasks', dict(study__tasks=()), 'study.tasks is empty'),
      ('no_models', dict(study__models=()), 'study.models is empty'),
      ('unknown_encoding', dict(study__encodings=('myenc',)),
       r"study entry 'myenc': 'myenc' is neither an encoding \(alibi, .*, xpos\) nor a variant "
       r'\(mta_lookup, ngram_lookup, rnope_swa\); your own encoding: register it with '
       r'attention_jax.register_encoding in a module and name that module in '
       r'--config.imports=my_module\.$'),
      ('unknown_options_group', dict(model__encoding_options={'myenc': {'x': 1}}),
       r"model.encoding_options has 'myenc'; allowed: .*--config.imports=my_module\.$"),
  )
  def test_bad_study_is_one_config_error(self, overrides, message):
    with self.assertRaisesRegex(ConfigError, message):
      validate_config(_config(**overrides), study=True)


class EntryPointTest(absltest.TestCase):
  """The run's own failures, in-process."""

  def test_out_of_memory_names_what_to_reduce_and_leaves_no_files(self):
    parent = tempfile.mkdtemp()
    workdir = os.path.join(parent, 'new')

    def run():
      with process.entry_point(_config(), workdir=workdir):
        os.makedirs(os.path.join(workdir, 'runs', 'seed0', 'checkpoints'))
        pathlib.Path(workdir, 'runs', 'seed0', 'config.json').write_text('{}')
        raise jax.errors.JaxRuntimeError(
            'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8.00GiB.')
    self.assertEqual(exit_line(run), (
        'error: Out of memory while trying to allocate 8.00GiB; reduce train.batch_size, '
        'eval.batch_size, the model (model.d_model, model.num_layers, model.mlp_dim) or the '
        'lengths (task.train_max_length, eval.max_length).'))
    self.assertEqual(os.listdir(parent), [])

  def test_out_of_memory_keeps_what_was_there_and_finished_checkpoints(self):
    workdir = tempfile.mkdtemp()
    old = os.path.join(workdir, 'runs', 'old')
    os.makedirs(old)

    def run():
      with process.entry_point(_config(), workdir=workdir):
        os.makedirs(os.path.join(workdir, 'runs', 'done', 'checkpoints', '5'))
        os.makedirs(os.path.join(workdir, 'runs', 'failed', 'checkpoints'))
        raise MemoryError()
    self.assertStartsWith(exit_line(run), 'error: out of host memory; reduce train.batch_size')
    self.assertCountEqual(os.listdir(os.path.join(workdir, 'runs')), ['old', 'done'])

  def test_missing_import_and_stop_message_are_one_line(self):
    line = exit_line(lambda: process.entry_point(_config(imports=('no_such_module',))).__enter__())
    self.assertRegex(line, r"^error: config.imports has 'no_such_module': no such module.*"
                     r'--config.imports=my_module\.$')
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as ex:
      with process.entry_point(_config()):
        raise TrainingInterrupted('stopped by train.stop_after after step 2 of 4', None)
    self.assertEqual(ex.exception.code, 0)
    self.assertEqual(stderr.getvalue(), 'stopped by train.stop_after after step 2 of 4\n')

  def test_no_tpu_line_and_other_backend_lines_kept(self):
    process.quiet_logs()
    logger = logging.getLogger('jax._src.xla_bridge')
    with self.assertLogs(logger, logging.INFO) as logs:
      logger.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
      logger.info("Unable to initialize backend 'cuda': no GPU")
    self.assertEqual(logs.output, ["INFO:jax._src.xla_bridge:Unable to initialize backend "
                                   "'cuda': no GPU"])


def _process(*args):
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}  # as a user runs it
  return subprocess.run([sys.executable, '-m', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=env)


class EntryPointProcessTest(absltest.TestCase):
  """The real commands: parse_flags and entry_point wired in, no libtpu line."""

  def test_every_config_entry_point_parses_with_parse_flags(self):
    for path in sorted((ROOT / 'experiments').glob('*.py')):
      source = path.read_text()
      # Every command: its one-line errors and the libtpu filter (make demo too).
      if 'app.run(' in source or path.name == 'cli.py':
        self.assertRegex(source, r'app\.run\(main, flags_parser=parse_flags\)', path.name)

  @pytest.mark.slow
  def test_commands_print_one_line_and_leave_nothing(self):
    for args, message in (
        (('experiments.length_extrapolation', '--config.study.encodings=()'),
         r'error: invalid config: study.encodings is empty'),
        # The MLP's 16 TiB bias: refused by the evaluation budget before anything
        # is allocated, naming the model rather than the lengths.
        (('experiments.train', '--config.model.mlp_dim=4398046511104'),
         r'error: invalid config: one evaluation call .* GiB.*reduce eval.batch_size or '
         r'the model \(model.d_model, model.num_layers, model.mlp_dim\)'),
        # An option the config does not list, checked where the encoding is built.
        (('experiments.train', '--config.model.encoding=rope',
          '--config.model.encoding_options.rope.base=-1.0'),
         r'error: invalid config: model.encoding_options.rope.base=-1.0 must be a finite '
         r'number > 1'),
        # An encoding's own length limit, checked before training, not after it.
        (('experiments.train', '--config.model.encoding=xpos', '--config.eval.max_length=20000',
          '--config.eval.lengths=(4,20000)'),
         r"error: invalid config: eval.max_length=20000 on 'copy' reads positions 0 … 40001, "
         r"past what 'xpos' serves")):
      workdir = os.path.join(tempfile.mkdtemp(), 'new')
      out = _process(*args, TINY, f'--workdir={workdir}')
      self.assertEqual(out.returncode, 2, out.stderr[-3000:])
      lines = out.stderr.strip().splitlines()
      self.assertLen(lines, 1, out.stderr)  # no traceback, no libtpu line
      self.assertRegex(lines[0], '^' + message)
      self.assertFalse(os.path.exists(workdir), os.listdir(os.path.dirname(workdir)))



if __name__ == '__main__':
  absltest.main()
