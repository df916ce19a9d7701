r"""Multi-digit addition past the training length: train on operands of 1–10
digits, test up to 40 (4×), every method on the same grid.

  python -m experiments.length_extrapolation --config=configs/addition.py \
      --workdir=runs/addition

It trains the entries of STUDIES['default'] below × seeds 0, 1, 2 on
`a + b = s` (digits least significant first, `attention_jax/lab/tasks/
addition.py`) with operand lengths drawn independently from 1–10, evaluates
every model at 15 lengths from 1 to 40 digits (both operands that long) by
teacher forcing, and on the grid of (digits of a) × (digits of b) in
`eval.grid`; writes results.csv, grid.csv, summary.md, extrapolation.png and
addition_grid.png to the workdir, and scores every run on the hard set
(hard.csv: carry chains, 999 + 99, zeros). Expected: windowed_rope:coupled
adds uniform 40-digit sums with >= 97% exact match on each seed (5 seeds:
99.2% mean, worst 97.7%) but is exact on every hard case on 2 of 5 seeds
only; every other entry fails past about 15 digits. 3 seeds took 14 min 24 s
in a fresh clone of 00fbaa3, alone on the 2-core CPU, 2026-12-05. The
measured numbers are in docs/results.md, written from real runs.

Presets by `:arg`, comma-separated `key=value`, as configs/copy.py:

  encoding=ENTRY  the one run (train.py) or the only entry swept
                  (length_extrapolation.py); the variants below are parts
                  of an entry: `none:abacus`, `fire:abacus`, `fire:hints`,
                  `windowed_rope:coupled:carry` (carry-heavy training sums)
  scale=NAME      cpu (default) | paper (Cho et al. 2024's 1-layer coupling
                  run, scripts/addition/run_coupling.sh; for GPU/TPU; not
                  yet run) | tiny
                  (the tests' smoke run: 5 steps for every entry, 4 sums per
                  length, every length in one program; the default study's
                  10 entries took 77 s in a fresh clone of 0036474, alone
                  on the 2-core CPU, 2026-12-05, nearly all of it
                  compiling: about 8 s per entry, two at a time)
  study=NAME      which entries a study sweeps: STUDIES below; `carry`
                  is our recipe with and without carry-heavy training sums
                  (with --config.study.seeds='(0,1,2,3,4)': 10 runs in 7 min
                  29 s on the 2-core CPU, 2026-12-05, not alone; expected:
                  2 of 5 seeds exact on the whole hard set without, 3 of 5
                  with, every 9…9 case on 5 of 5 with; docs/addition.md)
"""

import ml_collections

try:  # installed: the presets ship as attention_jax.configs
  from attention_jax.configs import copy
except ModuleNotFoundError:  # the clone, run from its root: configs/ is a top-level package
  from configs import copy

from attention_jax.lab.config import preset_arguments
from attention_jax.lab.config import entries
from attention_jax.lab.config.entries import entry_config

# Named variants (study.variants): parts of an entry (`none:abacus`, `fire:hints`).
VARIANTS = {
    # Abacus embeddings (McLeish et al. 2024, abacus.py): each digit's index in
    # its number, a learned table, a random offset k in [0, max_k] in training.
    'abacus': dict(model=dict(abacus=True)),
    # Index hints (Zhou et al. 2024): a marker before each digit, one per
    # significance, shared by a, b and the sum.
    'hints': dict(task=dict(index_hints=True)),
    # A quarter of the training sums carry-heavy (task.carry_mix, ours; the
    # hard set's carry chains are then seen in training, at its lengths).
    'carry': dict(task=dict(carry_mix=0.25)),
}
# NoPE and the lesson's encodings; FIRE alone and randomized (Zhou et al.);
# Abacus alone and with FIRE (McLeish et al.); index hints with FIRE; coupled
# ids (Cho et al.) under RoPE and our windowed RoPE.
DEFAULT = ('none', 'rope', 'alibi', 'fire', 'fire:randomized', 'none:abacus', 'fire:abacus',
           'fire:hints', 'rope:coupled', 'windowed_rope:coupled')
STUDIES = {
    'default': dict(encodings=DEFAULT),
    # The methods of the three papers alone, for a quick look.
    'records': dict(encodings=('fire:randomized:hints', 'fire:abacus', 'rope:coupled')),
    # Our recipe trained on uniform sums and with carry-heavy ones mixed in:
    # whether the seeds that fail the hard set's carry chains are fixed by data.
    'carry': dict(encodings=('windowed_rope:coupled', 'windowed_rope:coupled:carry')),
}
SCALES = ('cpu', 'paper', 'tiny')


def get_config(arg=None):
  preset = preset_arguments.parse(
      arg, dict(encoding=None, scale='cpu', study='default'),
      choices=dict(scale=SCALES, study=tuple(STUDIES)),
      example='configs/addition.py:encoding=fire:abacus,scale=tiny')
  # The copy config's fields (model, positions, train, eval, study; each
  # documented there), with what addition changes below.
  c = copy.get_config('scale=tiny' if preset['scale'] == 'tiny' else None)

  c.task = ml_collections.ConfigDict()
  c.task.name = 'addition'
  c.task.vocab_size = 10  # decimal digits (fixed; '+', '=' and the hints come on top)
  c.task.train_min_length = 1  # fewest digits of a training operand
  c.task.train_max_length = 10  # most digits of a training operand ("L_train")
  # Operands least significant digit first (McLeish --reverse_all, Zhou et al.);
  # False: most significant first, as Cho et al.'s configs (the sum is always reversed).
  c.task.reverse_operands = True
  c.task.pad_zeros = False  # Cho's padding: operands to max(la, lb) digits, the sum to one more
  c.task.index_hints = False  # Zhou's index hints (the `hints` variant sets it)
  c.task.num_hints = 102  # the cyclic set of hint markers (102 in McLeish's and Zhou's code)
  c.task.pack = 1  # examples per training sequence
  c.task.pack_segments = 0  # packed rows of isolated examples (configs/copy.py); 0 = off
  # Training only: the fraction of training sums drawn carry-heavy (each digit 9
  # with probability 1/2), where uniform sums almost never chain carries or add
  # 9 + 9 at the top; 0 = uniform, as the papers train. The `carry` variant sets it.
  c.task.carry_mix = 0.0

  c.model.encoding = 'fire'
  c.model.num_layers = 2
  c.model.abacus = False  # Abacus embeddings on the digits (the `abacus` variant sets it)
  # Largest training offset k (ids 1+k … n+k): McLeish's 99 for 20-digit training
  # and 100-digit tests; ours covers the 41-digit sums at 4× (10 + 1 + 30 <= 41).
  c.model.abacus_max_k = 30
  c.model.abacus_embeddings = 0  # rows of the Abacus table; 0 = enough for every id (auto)

  # 1,600 steps of 32 sums: the ten entries x 3 seeds fit 20 minutes on 2 cores.
  c.train.num_steps = 1600
  c.eval.max_length = 40  # most digits of an evaluated operand (4 × L_train)
  c.eval.lengths = ()  # () = 1 … 10, then 12, 15, 20, 30, 40 digits (both operands)
  c.eval.rope_scalings = ()  # no PI/NTK/YaRN rows: not what this study compares
  # (digits of a) × (digits of b) evaluated on every pair of these, teacher-forced
  # exact match only (the same as greedy by construction): the papers' grid figure.
  c.eval.grid = (1, 5, 10, 20, 30, 40)
  c.eval.grid_samples = 32  # sums per grid cell
  c.eval.num_samples = 128  # sums per evaluated length (both operands that long)
  c.eval.batch_size = 128  # sums per compiled evaluation call
  # Teacher forcing only: its exact match is greedy decoding's by construction (a
  # sum is exact iff every next-token prediction is), and the cached path is
  # tested (tests/positional/test_abacus.py); True adds the greedy rows (+12% time).
  c.eval.generate = False

  c.study.tasks = ('addition',)
  c.study.encodings = (preset['encoding'],) if preset['encoding'] else \
      STUDIES[preset['study']]['encodings']
  c.study.variants = ml_collections.ConfigDict(dict(copy.VARIANTS, **VARIANTS))

  if preset['scale'] == 'paper':
    _paper(c)
  elif preset['scale'] == 'tiny':  # every entry a few steps: a smoke test, not a study
    c.task.train_max_length = 3
    c.train.num_steps = 5
    c.eval.update(max_length=6, grid=(1, 6), grid_samples=4, num_samples=4, batch_size=4)
    c.study.variants = ml_collections.ConfigDict(
        entries.tiny_variants(dict(copy.VARIANTS, **VARIANTS)))
  if preset['encoding']:
    c = entry_config(c, preset['encoding'])
  return c


def _paper(c):
  """Cho et al. 2024's 1-layer addition run as released with the paper
  (HanseulJo/position-coupling@0c72d14, scripts/addition/run_coupling.sh):
  1 layer, 4 heads of width 128 (d_model 512), d_ff 2048, batch 1000, 50,000
  steps, lr 1e-4, no weight decay, operands of 1–30 digits, tests to 200
  digits (their max_position 202; ours eval.max_length + 3 = 203). Their
  model is T5-style (RMSNorm before and after, gated GELU); ours is our
  pre-LayerNorm block. For GPU/TPU."""
  c.model.update(num_layers=1, num_heads=4, d_model=512, mlp_dim=2048)
  c.task.train_max_length = 30
  c.train.update(batch_size=1000, num_steps=50_000, learning_rate=1e-4, weight_decay=0.0,
                 warmup_steps=500)
  c.eval.update(max_length=200, grid=(1, 10, 20, 30, 50, 100, 150, 200), grid_samples=100)
  # One setup at a time: two would hold both setups' stacked seeds (evaluated
  # in calls of eval.batch_size sums of up to 604 tokens) in memory at once.
  c.study.parallel_setups = 1
  c.model.abacus_max_k = 99  # McLeish's default (20-digit training, 100-digit tests)
