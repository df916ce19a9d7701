"""Which entry points take which configs: `config.protocol` ('decoder' or
'encoder') against every entry point's --config, and the protocol's refusals
(a value outside the table, the older field `kind`, a config of the other
protocol's fields), each one line as --config is parsed."""

import os
import pathlib
import re
import tempfile

from absl import flags
from absl.testing import absltest

from attention_jax.lab.config import presets
from tests.lab.configs import exit_line

ROOT = pathlib.Path(__file__).resolve().parents[3]


class PresetProtocolTest(absltest.TestCase):
  """Every entry point's --config against every packaged preset: the two
  benchmark entry points take either protocol (`config.protocol` chooses the
  benchmark); the others take their default's protocol, and another's is
  one line naming both."""

  def test_every_entry_point_with_every_preset(self):
    taken = {}  # default preset -> the protocols its entry point names
    for path in sorted((ROOT / 'experiments').glob('*.py')):
      found = re.search(r"DEFINE_config_file\(\s*'config',\s*'(\w+)'([^)]*)\)",
                        path.read_text())
      if found:
        taken[path.stem] = (found.group(1), 'protocols=' in found.group(2))
    self.assertEqual(taken, {'length_extrapolation': ('copy', True),
                             'chomsky': ('chomsky', True), 'train': ('copy', False),
                             'attention_maps': ('copy', False),
                             'seq2seq_bottleneck': ('seq2seq', False)})
    protocols = {name: presets.protocol_of(presets._load(name)) for name in presets.available()}
    self.assertEqual(protocols, {'addition': 'decoder', 'copy': 'decoder', 'flipflop': 'decoder',
                                 'seq2seq': 'decoder', 'chomsky': 'encoder'})
    for default, both in sorted(set(taken.values())):
      for preset, protocol in sorted(protocols.items()):
        flag_values = flags.FlagValues()
        presets.DEFINE_config_file('config', default, '', flag_values=flag_values,
                                   protocols=presets.PROTOCOLS if both else ())
        parse = lambda: flag_values['config'].parser.parse(f'{preset}:scale=tiny')
        if both or protocol == protocols[default]:
          self.assertEqual(presets.protocol_of(parse()), protocol)
          continue
        line = exit_line(parse)
        self.assertRegex(line, rf"^error: --config={preset}:scale=tiny: a config of protocol "
                               rf"'{protocol}', for experiments.* this entry point takes "
                               rf"protocol '{protocols[default]}': the presets ")

  def test_a_protocol_outside_the_table_of_other_fields_or_older_name_is_one_line(self):
    # A file of one's own on chomsky's preset (or copy's), then a line that
    # changes its protocol, through every kind of entry point.
    for preset, change, expected in (
        ('chomsky', 'c.protocol = "encoders"',
         r"protocol='encoders'; choose from \('decoder', 'encoder'\)"),
        ('chomsky', 'c.protocol = "chomsky"', r"protocol='chomsky'; choose from"),
        ('chomsky', 'del c["protocol"]; c.kind = "chomsky"',
         r"the field kind='chomsky' is named protocol now: protocol='encoder'"),
        ('chomsky', 'c.protocol = "decoder"',
         r"protocol='decoder', but its fields are the encoder protocol's \(9 of "
         r"configs/chomsky.py's own: .*\); a config of protocol 'decoder' has the fields of "
         r'configs/copy.py\.$'),
        ('chomsky', 'del c["protocol"]', r"no protocol field \(so 'decoder'\), but its fields "
                                         "are the encoder protocol's"),
        ('copy', 'c.protocol = "encoder"',
         r"protocol='encoder', but its fields are the decoder protocol's")):
      folder = tempfile.mkdtemp()
      path = os.path.join(folder, 'mine.py')
      with open(path, 'w') as f:
        f.write(f'from configs import {preset}\n'
                'def get_config():\n'
                f'  c = {preset}.get_config("scale=tiny")\n'
                f'  {change}\n'
                '  return c\n')
      for default, protocols in (('chomsky', presets.PROTOCOLS), ('copy', ())):
        flag_values = flags.FlagValues()
        presets.DEFINE_config_file('config', default, '', flag_values=flag_values,
                                   protocols=protocols)
        line = exit_line(lambda: flag_values['config'].parser.parse(path))
        self.assertRegex(line, rf'^error: --config={re.escape(path)}: invalid config: {expected}')


if __name__ == '__main__':
  absltest.main()
