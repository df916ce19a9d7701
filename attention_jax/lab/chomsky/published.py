"""What the papers publish on this benchmark, with where each value comes
from, beside ours in summary.md and the README.

Only values read in a stored source are here. Ruoss et al. 2023's Table 1
(per task × encoding) and DAPE's table on these tasks could not be read:
the stored copies of the papers (arXiv 2305.16843 on ar5iv, its LaTeX in
SPIQA) return only their openings, so `ruoss_2023` has no cell yet and the
tables say so rather than quote numbers from memory.
"""

RUOSS_2023_SOURCE = ('Ruoss et al. 2023, arXiv 2305.16843, Table 1: not transcribed (the stored '
                     'copies give only the opening of the paper); the abstract: randomized '
                     'encodings raise test accuracy by 12.0% on average over 15 tasks, 6,000 models')
# The abstract's average gain of the randomized encodings, in accuracy points.
RUOSS_2023_MEAN_GAIN = 12.0
# google-deepmind/neural_networks_chomsky_hierarchy issue #7 (2023-12-29, the
# authors): the reported score is the maximum over 10 seeds.
SCORE_STATISTIC = 'max over 10 seeds (neural_networks_chomsky_hierarchy issue #7)'
_RUOSS_2023 = {}


def ruoss_2023(task: str, encoding: str):
  """Ruoss et al. 2023 Table 1's accuracy (%) for `task` × `encoding` (our
  spec names), or None where it is not transcribed."""
  return _RUOSS_2023.get((task, encoding))
