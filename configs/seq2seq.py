r"""Lesson 7.1 made measurable: the seq2seq bottleneck on the copy task.

  python -m experiments.seq2seq_bottleneck --config=configs/seq2seq.py \
      --workdir=runs/seq2seq

Same task, lengths, metrics and budget as configs/copy.py's CPU preset, over
three models × seeds 0, 1, 2: a GRU encoder-decoder whose decoder sees only the
encoder's final state ('seq2seq'), the same with Bahdanau attention
('seq2seq_attention'), and the transformer with ALiBi (the best encoding of
the copy study). Seq2seq rows are scored by greedy decoding, the transformer
under teacher forcing; exact match means the same for both. Writes
results.csv, summary.md, extrapolation.png and attention_heatmap.png (Bahdanau
weights on one copy example at L_train and at 4 × L_train). 2 min 41 s in a
fresh clone of 00fbaa3, alone on the 2-core CPU, 2026-12-05; the numbers are
in docs/results.md. Presets as in configs/copy.py
(`:task=reverse`, `:scale=tiny`: 5 steps for each of the three models, 24 s
in a fresh clone of 0036474, alone on the 2-core CPU, 2026-12-05, nearly all
of it compiling).
"""

try:  # installed: the presets ship as attention_jax.configs
  from attention_jax.configs import copy
except ModuleNotFoundError:  # the clone, run from its root: configs/ is a top-level package
  from configs import copy


def get_config(arg=None):
  c = copy.get_config(arg)
  c.model.encoding = 'alibi'  # the transformer's encoding
  c.study.models = ('seq2seq', 'seq2seq_attention', 'transformer')  # compared models
  c.study.encodings = ('alibi',)  # transformer encodings in the comparison
  return c
