"""Writing a benchmark's results: raw JSON plus a Markdown table, side by side."""

import json
import os


def write_report(out_dir: str, name: str, payload, table_lines: list[str]) -> None:
  """`out_dir/name.json` (the payload) and `out_dir/name.md` (the table), and
  the table on stdout."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f'{name}.json'), 'w') as f:
    json.dump(payload, f, indent=1)
  with open(os.path.join(out_dir, f'{name}.md'), 'w') as f:
    f.write('\n'.join(table_lines) + '\n')
  print('\n'.join(table_lines))
