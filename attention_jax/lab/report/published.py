"""What the papers publish on this benchmark, with where each value comes
from, beside ours in summary.md and the README. Only values read in a
stored source are here (docs/chomsky_published.md lists every place
searched).

* DAPE (Zheng et al., NeurIPS 2024, arXiv 2405.14722), Table 2: the
  randomized versions of learned, sin/cos, RoPE, relative, ALiBi, Kerple and
  FIRE (and DAPE itself) on 14 of the 15 tasks (no binary_multiplication),
  trained on lengths 1–40 for 200k steps, tested on 41–500; 5 layers, 8
  heads, d_model 256 (their App. D). Read in a text extraction of the
  camera-ready PDF (GitHub `commotum/4D`, `Notes/Vision/pdfs-3/2024_DAPE.txt`,
  commit 0622fc1f, lines 570–589). Their table does not say whether the
  baselines are a max or a mean over seeds.
* Ruoss et al. 2023 (ACL 2023, arXiv 2305.16843), Table 1: not transcribed;
  the stored copies give only the paper's opening. The abstract's average
  gain of the randomized encodings, 12.0 points, is the one number read.
"""

RUOSS_2023_SOURCE = ('Ruoss et al. 2023, arXiv 2305.16843, Table 1: not transcribed (the stored '
                     'copies give only the opening of the paper); the abstract: randomized '
                     'encodings raise test accuracy by 12.0% on average over 15 tasks, 6,000 models')

DAPE_2024_SOURCE = ('DAPE (Zheng et al., NeurIPS 2024, arXiv 2405.14722), Table 2: randomized '
                    'encodings, 5 layers × d_model 256, 200k steps, train 1–40, test 41–500 '
                    '(read in a text extraction of the camera-ready PDF, GitHub commotum/4D, '
                    'Notes/Vision/pdfs-3/2024_DAPE.txt)')
# Table 2's columns, as our encoding specs (kerple and fire randomized, and
# DAPE, are theirs; our encoder protocol randomizes the first five).
DAPE_2024_COLUMNS = ('learned:randomized', 'sinusoidal:randomized', 'rope:randomized',
                     'relative:randomized', 'alibi:randomized', 'kerple:randomized',
                     'fire:randomized', 'dape_alibi', 'dape_kerple', 'dape_fire')
_DAPE_2024_ROWS = {  # accuracy %, in DAPE_2024_COLUMNS' order
    'even_pairs': (50.04, 91.27, 99.98, 96.60, 73.52, 57.50, 73.86, 99.99, 99.58, 100),
    'modular_arithmetic': (19.95, 20.39, 21.35, 20.84, 20.02, 21.79, 21.09, 23.58, 24.47,
                           24.46),
    'parity_check': (50.14, 50.52, 50.05, 50.09, 50.09, 50.07, 50.97, 50.30, 50.07, 50.04),
    'cycle_navigation': (24.97, 25.37, 27.63, 26.95, 24.64, 29.47, 28.41, 22.99, 34.53, 27.54),
    'stack_manipulation': (59.92, 65.92, 61.49, 64.73, 66.42, 66.93, 69.33, 68.18, 72.04,
                           70.90),
    'reverse_string': (52.76, 67.28, 65.23, 65.59, 71.09, 71.54, 65.89, 73.37, 70.74, 76.40),
    # Their "Modular Arithmetic" in the DCF rows: the bracket task.
    'modular_arithmetic_brackets': (31.00, 30.70, 31.25, 31.74, 30.56, 24.79, 30.92, 31.34,
                                    32.37, 31.50),
    'solve_equation': (20.00, 19.97, 21.85, 22.93, 19.92, 21.15, 22.06, 20.03, 22.49, 22.42),
    'duplicate_string': (52.77, 65.44, 64.97, 67.66, 65.13, 66.72, 69.03, 70.84, 72.95, 72.71),
    'missing_duplicate_string': (50.38, 49.78, 63.37, 72.34, 74.21, 79.06, 79.27, 83.41, 87.57,
                                 89.17),
    'odds_first': (52.77, 58.61, 61.00, 61.57, 59.88, 62.59, 63.28, 63.78, 67.08, 66.34),
    'binary_addition': (54.63, 55.78, 55.59, 56.96, 54.72, 56.35, 55.70, 59.71, 60.88, 56.62),
    'compute_sqrt': (50.47, 51.11, 51.88, 51.63, 50.63, 51.11, 50.80, 51.64, 51.33, 52.46),
    'bucket_sort': (98.32, 98.92, 98.12, 99.31, 98.45, 99.38, 99.57, 99.38, 98.81, 99.37),
}


def dape_2024(task: str, encoding: str):
  """DAPE's Table 2 accuracy (%) for `task` × `encoding` (our spec names,
  `DAPE_2024_COLUMNS`), or None where the table has no such cell."""
  row = _DAPE_2024_ROWS.get(task)
  if row is None or encoding not in DAPE_2024_COLUMNS:
    return None
  return row[DAPE_2024_COLUMNS.index(encoding)]
