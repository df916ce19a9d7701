r"""Flip-flop language modeling (Liu et al., NeurIPS 2023): train on FFL(0.8),
test in distribution, on sparse (FFL(0.98)) and dense (FFL(0.1)) sequences,
and at lengths past training, every frontier entry on the same data.

  python -m experiments.length_extrapolation --config=configs/flipflop.py \
      --workdir=runs/flipflop

It trains the entries of STUDIES['default'] below × seeds 0, 1, 2 on
sequences of 16 instructions (w: write a bit, r: read the last written bit,
i: ignore; attention_jax/lab/tasks/flipflop.py), the loss on the read bits
only, and scores every model on 16, 32 and 64 instructions (1×, 2×, 4×)
drawn from each of the three distributions: results.csv has one row per
(task, entry, seed, length), the task 'flipflop' (in distribution),
'flipflop_sparse' or 'flipflop_dense'; summary.md a table per task (token
accuracy: the fraction of reads right, 1 − the paper's error rate; exact
match: sequences with every read right). docs/flipflop.md has the paper's
claims beside ours.

Presets by `:arg`, comma-separated `key=value`, as configs/copy.py:

  encoding=ENTRY  the one run (train.py) or the only entry swept
  scale=NAME      cpu (default: 2 layers of width 64, 500 steps of 32
                  sequences; 10 min 37 s in a fresh clone of 00fbaa3, alone
                  on the 2-core CPU, 2026-12-05; docs/flipflop.md)
                  | paper (the paper's setting, for GPU/TPU, not yet run:
                  256 instructions, a 6-layer GPT-2 of width 512, 10,000
                  steps of 16, tests to 1,024 instructions with 4,096
                  sequences per set and length; its train step and longest
                  evaluation lower for TPU and CUDA, blockwise, for rope,
                  path and rnope_swa: tests/lab/train/test_lowering.py -k
                  flipflop_paper)
                  | tiny (the tests' smoke run: 5 steps for every entry; the
                  13 entries took 90 s in a fresh clone of 0036474, alone
                  on the 2-core CPU, 2026-12-05, nearly all of it compiling)
  study=NAME      which entries a study sweeps: STUDIES below
"""

import ml_collections

try:  # imported as a module of its package (configs or attention_jax.configs): its sibling
  from . import copy
except ImportError:  # loaded from its path (--config=configs/flipflop.py)
  try:  # installed: the presets ship as attention_jax.configs
    from attention_jax.configs import copy
  except ModuleNotFoundError:  # the clone, run from its root: configs/ is a top-level package
    from configs import copy

from attention_jax.lab.config import preset_arguments
from attention_jax.lab.config.entries import entry_config

# RoPE, NoPE and ALiBi (the paper's baselines are RoPE-free GPT-2s; PaTH's
# paper compares RoPE), then the copy study's frontier: FIRE, CoPE, xPos,
# p-RoPE, FoX, DAPE, stick-breaking, PaTH, PaTH-FoX and the RNoPE-SWA hybrid.
DEFAULT = ('rope', 'none', 'alibi') + tuple(e for e in copy.FRONTIER
                                            if e not in ('rope', 'none', 'alibi'))
STUDIES = {
    'default': dict(encodings=DEFAULT),
    # What PaTH's paper claims on flip-flop, alone: PaTH against RoPE and NoPE.
    'path': dict(encodings=('rope', 'none', 'path', 'path_fox')),
}
SCALES = ('cpu', 'paper', 'tiny')


def get_config(arg=None):
  preset = preset_arguments.parse(
      arg, dict(encoding=None, scale='cpu', study='default'),
      choices=dict(scale=SCALES, study=tuple(STUDIES)),
      example='configs/flipflop.py:encoding=path,scale=tiny')
  # The copy config's fields (model, positions, train, eval, study; each
  # documented there), with what flip-flop changes below.
  c = copy.get_config('scale=tiny' if preset['scale'] == 'tiny' else None)

  c.task = ml_collections.ConfigDict()
  c.task.name = 'flipflop'  # FFL(task.p_ignore); flipflop_sparse / flipflop_dense are scored too
  c.task.vocab_size = 2  # the data are bits (w, r, i come on top)
  c.task.p_ignore = 0.8  # the training distribution FFL(0.8): i 80%, w and r 10% each
  # Instructions per training sequence: every sequence this long, as the
  # paper's (256 there; 2 tokens each, BOS first).
  c.task.train_min_length = 16
  c.task.train_max_length = 16
  c.task.pack = 1

  c.model.encoding = 'rope'
  # 500 steps: every entry tried reads 100% in distribution by step ~100 (RoPE, PaTH).
  c.train.num_steps = 500
  c.eval.max_length = 64  # instructions (4 × training)
  c.eval.lengths = (16, 32, 64)
  # The same models scored on the paper's sparse and dense distributions, rows
  # under these task names.
  c.eval.tasks = ('flipflop_sparse', 'flipflop_dense')
  c.eval.num_samples = 256  # sequences per (task, length)
  c.eval.batch_size = 256
  # Teacher forcing only: a read bit is predicted from the true prefix, as the
  # paper scores it (greedy generation would write the random instructions too).
  c.eval.generate = False
  c.eval.rope_scalings = ()

  c.study.tasks = ('flipflop',)
  c.study.encodings = (preset['encoding'],) if preset['encoding'] else \
      STUDIES[preset['study']]['encodings']

  if preset['scale'] == 'paper':
    _paper(c)
  elif preset['scale'] == 'tiny':  # every entry a few steps: a smoke test, not a study
    c.task.train_min_length = c.task.train_max_length = 4
    c.train.num_steps = 5
    c.eval.update(max_length=8, lengths=(4, 8), num_samples=4, batch_size=4)
  if preset['encoding']:
    c = entry_config(c, preset['encoding'])
  return c


def _paper(c):
  """The paper's FFLM setting, for GPU/TPU. From its released data
  (huggingface.co/datasets/synthseq/flipflop): 256 instructions per
  sequence, training on FFL(0.8), tests on FFL(0.8), FFL(0.98) and FFL(0.1).
  The model and optimizer (a 6-layer, 8-head GPT-2 of width 512, 10,000
  steps of batch 16, learning rate 3e-4) are our reading of the paper, not
  checked against code of theirs (docs/flipflop.md); ours is our pre-LN
  block. Tests to 4× the training length."""
  c.model.update(num_layers=6, num_heads=8, d_model=512, mlp_dim=2048)
  c.task.train_min_length = c.task.train_max_length = 256
  c.train.update(batch_size=16, num_steps=10_000, learning_rate=3e-4, warmup_steps=500,
                 checkpoint_every=1000)
  # Calls of 16 × 3 stacked seeds, one setup at a time: 48 sequences of 2,048
  # tokens through a model of width 512 (the evaluation budget's estimate: 6 GiB).
  c.eval.update(max_length=1024, lengths=(256, 512, 1024), num_samples=4096, batch_size=16)
  c.study.parallel_setups = 1
  # Three windowed RoPE layers per global NoPE one, as RNoPE-SWA, the window
  # a sixteenth of the training sequence (SWAN-GPT: 512 of 8,192).
  c.study.variants.rnope_swa.model.encoding_layers = 'rope/32,rope/32,rope/32,none'
