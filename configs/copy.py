r"""Length extrapolation on synthetic copy tasks: train short, test long.

The default is the study `make experiment` runs on a 2-core CPU:

  python -m experiments.length_extrapolation --config=configs/copy.py \
      --workdir=runs/study

It trains 24 models (the entries of STUDIES['default'] below × seeds 0, 1,
2; the seeds of one entry in one compiled program, two entries side by
side) on `copy` with inputs of length 1–8, evaluates every model at 15
input lengths from 1 to 64 (1–8, then 1.25×, 1.5×, 2×, 3×, 4×, 6×, 8× the
training maximum) under teacher forcing and by greedy generation, evaluates
the RoPE models again with three context extensions (rows rope+pi, rope+ntk,
rope+yarn), and writes results.csv, ceiling.csv, summary.md and
extrapolation.png to the workdir. Expected: every entry near 100% token
accuracy in the training range; past it only the entries told where to look
(windowed_rope:coupled) or copying by content (mta_lookup) stay exact. The
measured numbers are in docs/results.md, written from a real run; it took
9 min 18 s in a fresh clone of b3000b3, alone on the 2-core CPU, 2026-12-05
(hard set included).

One model: `python -m experiments.train --config=configs/copy.py:encoding=rope
--workdir=runs/one` (68 s: 2,000 steps and the evaluation, in a fresh
clone of 00fbaa3, alone on the 2-core CPU, 2026-12-05).
Presets by `:arg`, comma-separated `key=value`:

  encoding=ENTRY  the one run (train.py) or the only entry swept
                  (length_extrapolation.py): BASE[:PART…], BASE an encoding
                  (attention_jax.ENCODINGS) or a variant (VARIANTS below),
                  PART one of randomized, coupled, stick_breaking
                  (attention_jax/lab/config/entries.py)
  task=NAME       copy | reverse | duplicate, or any task of
                  attention_jax.lab.tasks.TASKS (DeepMind's 15, addition)
  scale=NAME      the model and its training: cpu (default) | paper (Delétang
                  et al. 2022 / Ruoss et al. 2023: 5 layers, 8 heads, batch
                  128, train lengths 1–40, evaluation to 500, 10 seeds; for
                  GPU/TPU; not yet run) | tiny (the tests' smoke run: 5 steps for every
                  entry, variants included, every length in one evaluation
                  program; mostly compiling, three programs per entry (train
                  step, evaluation, generation): the default study's 8
                  entries took 49 s in a fresh clone of 0036474, alone on
                  the 2-core CPU, 2026-12-05)
  study=NAME      which entries and tasks a study sweeps: STUDIES below
                  (default | extended | frontier | all | generalize)

Any field can be overridden: `--config.model.num_heads=8`.
"""

import ml_collections

from attention_jax.lab.config import preset_arguments
from attention_jax.lab.config import entries
from attention_jax.lab.config.entries import entry_config

# Named variants of the default model (study.variants): an entry (or
# `:encoding=NAME`) naming one trains the default model with these fields
# replaced, labelled NAME. Two that copy by content alone (no coupling, no
# position ids: nothing tells them where to look):
# * mta_lookup: one layer of Multi-Token Attention's key-query convolution
#   (positional/mta.py) on NoPE scores, reading this query and the 5 before it ×
#   this key and the 5 before it (pad_key='left': no later key), so one weight
#   matches the last few tokens against the few before a key: an n-gram lookup
#   in one head, and nothing else for a length to leak into; one layer (a second
#   drifts) and 3,000 steps (the lookup sharpens late).
# * ngram_lookup: Hard-ALiBi's windows shifted (hard_alibi offsets): four heads
#   each read exactly one earlier token (1 … 4 back), so every position holds
#   its last five tokens in order, and a fifth, NoPE head looks them up, with
#   scalable softmax; it matches four tokens in one dot product, so its head
#   is wide (d_model 160, 5 heads).
# * rnope_swa: the hybrid of the 2025 long-context models (Cohere's RNoPE-SWA,
#   Yang et al. 2025, arXiv 2501.18795; SWAN-GPT, arXiv 2504.08719): RoPE over a
#   sliding window of the 4 latest tokens in one layer, global attention without
#   an encoding (NoPE) in the other (their models have three windowed layers per
#   global one; our two layers hold one of each). One entry: the pattern is
#   model.encoding_layers (attention_jax/nn/layer_pattern.py).
_RNOPE_SWA = dict(encoding='rope', encoding_layers='rope/4,none')
_MTA_LOOKUP = dict(encoding='mta', num_layers=1, encoding_options=dict(
    mta=dict(query_kernel_size=6, key_kernel_size=6, pad_key='left')))
_NGRAM_LOOKUP = dict(encoding='hard_alibi', num_heads=5, d_model=160, mlp_dim=640,
                     scalable_softmax=0.4, encoding_options=dict(
                         hard_alibi=dict(widths=(1, 1, 1, 1), offsets=(1, 2, 3, 4))))
VARIANTS = {
    'mta_lookup': dict(model=_MTA_LOOKUP, train=dict(num_steps=3000)),
    'ngram_lookup': dict(model=_NGRAM_LOOKUP, train=dict(learning_rate=1e-3)),
    'rnope_swa': dict(model=_RNOPE_SWA),
}

# The lesson's four encodings and NoPE, then the best of each kind: told where
# to look (coupled ids, every head windowed: ours), copying by content alone
# (mta_lookup), and the strongest 2024-25 single encoding past L_train (FIRE; the
# RNoPE-SWA hybrid of two copies more, docs/results.md).
DEFAULT = ('none', 'sinusoidal', 'learned', 'rope', 'alibi', 'fire', 'windowed_rope:coupled',
           'mta_lookup')
# The 2024-25 methods: FIRE, CoPE, xPos, p-RoPE, forgetting attention, DAPE,
# stick-breaking attention with no encoding (as its paper trains it), PaTH
# and PaTH-FoX (data-dependent Householder transforms, Yang et al. 2025) and
# the RNoPE-SWA hybrid (rnope_swa above).
FRONTIER = ('fire', 'cope', 'xpos', 'p_rope', 'fox', 'dape', 'none:stick_breaking', 'path',
            'path_fox', 'rnope_swa')
# The default's entries and the windowed recipes beside them (Hard-ALiBi, our
# learned window), forgetting attention (a data-dependent ALiBi) and coupled
# ids without the window.
EXTENDED = ('none', 'sinusoidal', 'learned', 'rope', 'alibi', 'hard_alibi', 'learned_window',
            'fire', 'fox', 'rope:coupled', 'windowed_rope:coupled', 'mta_lookup')
# Every encoding of the project: the above, the research relative biases and
# randomized positions.
ALL = EXTENDED + ('t5', 'kerple', 'learned:randomized', 'rope:randomized') + tuple(
    e for e in FRONTIER if e not in EXTENDED)

# What `:study=NAME` sweeps: its entries and tasks. The measured results of
# each are in docs/results.md.
STUDIES = {
    'default': dict(encodings=DEFAULT, tasks=('copy',)),
    'extended': dict(encodings=EXTENDED, tasks=('copy',)),
    'frontier': dict(encodings=FRONTIER, tasks=('copy', 'reverse', 'duplicate')),
    'all': dict(encodings=ALL, tasks=('copy', 'reverse', 'duplicate')),
    # Our CPU recipe alone (windowed_rope:coupled), at the lengths that matter.
    'generalize': dict(encodings=('windowed_rope:coupled',), tasks=('copy',)),
}
SCALES = ('cpu', 'paper', 'tiny')
_RENAMED = {'size': 'scale= (cpu, paper, tiny) or study= (generalize, all, frontier)'}


def get_config(arg=None):
  preset = preset_arguments.parse(
      arg, dict(encoding=None, task=None, scale='cpu', study='default'),
      choices=dict(scale=SCALES, study=tuple(STUDIES)), renamed=_RENAMED,
      example='configs/copy.py:encoding=rope,scale=paper')
  study = STUDIES[preset['study']]
  tasks = (preset['task'],) if preset['task'] else study['tasks']
  c = ml_collections.ConfigDict()
  # How a model reads its tasks and is scored: 'decoder' (a causal decoder,
  # teacher-forced and generated: this study) | 'encoder' (DeepMind's blank
  # output slots, configs/chomsky.py). It chooses the benchmark that runs.
  c.protocol = 'decoder'

  c.task = ml_collections.ConfigDict()
  c.task.name = tasks[0]  # copy | reverse | duplicate, or any of attention_jax.lab.tasks.TASKS
  c.task.vocab_size = 16  # symbols in x (special tokens BOS/SEP/EOS/PAD come on top)
  c.task.train_min_length = 1  # shortest training input, inclusive
  c.task.train_max_length = 8  # longest training input, inclusive ("L_train")
  # Examples packed back to back into one training sequence (Jelassi et al.
  # 2024: earlier examples are distractors, later ones sit at large positions);
  # the loss covers every example's outputs. Evaluation: one per sequence.
  c.task.pack = 1
  # Packed rows (what JAX trainers do, unlike task.pack): training rows of K padded
  # examples' tokens, filled with as many whole examples as fit, each attending only
  # to itself (segment ids) at positions restarting at 0; the loss is the mean over
  # every example's output tokens, as padded one per row. Removes padding: more
  # examples per step at the same batch_size (rows). Transformers; not with
  # task.pack > 1 or Abacus. 0 = off (one example per row, padded).
  c.task.pack_segments = 0

  c.model = ml_collections.ConfigDict()
  c.model.kind = 'transformer'  # transformer | seq2seq | seq2seq_attention (GRU, lesson 7.1)
  # A registry name (attention_jax.ENCODINGS), or NAME:randomized to train on
  # randomized positions (Ruoss et al. 2023; see `positions` below), NAME:coupled
  # on coupled ones (Cho et al. 2024). A study sets it per entry (study.encodings).
  c.model.encoding = 'windowed_rope:coupled' if preset['study'] == 'generalize' else 'rope'
  # Keyword options per encoding, passed to its `build` when that encoding is
  # used: model.encoding_options.NAME.OPTION (any option of the encoding's `build`,
  # e.g. --config.model.encoding_options.t5.num_buckets=64). An option not set here
  # takes its `build` default, recorded in each run's config.json. Set here: the
  # lab's choices, each with its reason.
  c.model.encoding_options = ml_collections.ConfigDict()
  # Hard-ALiBi (Jelassi et al. 2024): head h < len(widths) sees only keys with
  # 0 <= i - j < widths[h], the other heads are NoPE. Two windowed heads (1, 2) of
  # four: the paper's recipe of a few short windows beside global NoPE heads.
  c.model.encoding_options.hard_alibi = ml_collections.ConfigDict(dict(widths=(1, 2)))
  # Our learned window: the same two windows, their widths trained from (1, 2).
  c.model.encoding_options.learned_window = ml_collections.ConfigDict(dict(init_widths=(1, 2)))
  # windowed_rope (ours): RoPE, and each windowed head sees only keys with
  # |Δid| <= window; with coupled ids ('windowed_rope:coupled') a bounded,
  # length-independent neighbourhood.
  c.model.encoding_options.windowed_rope = ml_collections.ConfigDict(dict(
      window=2,  # x_{k+1} (Δ = −1) plus a margin
      # Every head windowed: a plain RoPE head sees the whole length and is what
      # fails past L_train (docs/results.md).
      num_windowed_heads=-1,
      # Keys at id 0 (BOS/EOS/PAD) open to every windowed head: where "no x_{k+1}"
      # puts its attention, so EOS is not confused with x_{k+1} = x_k in runs like 'cccc'.
      sink=True,
  ))
  # The study.variants entry this run's model is (its label in results); '' = none.
  c.model.variant = ''
  c.model.d_model = 64  # residual stream width (seq2seq: embedding width)
  c.model.num_heads = 4  # attention heads; must divide d_model
  c.model.num_layers = 2  # pre-LayerNorm transformer blocks
  c.model.mlp_dim = 256  # hidden width of each block's MLP
  c.model.max_positions = 0  # positions covered (learned table); 0 = the longest eval sequence
  c.model.num_kv_heads = 0  # key/value heads (grouped-query; 1 = multi-query); 0 = num_heads
  c.model.sliding_window = 0  # attend to this many latest tokens only (local attention); 0 = all
  # Which layers have the encoding, and each layer's window: None = every layer;
  # layer indices, e.g. (0,); or a pattern of NAME or NAME/WINDOW per layer,
  # repeated ('rope/4,none': RNoPE-SWA; attention_jax/nn/layer_pattern.py).
  c.model.encoding_layers = ml_collections.config_dict.placeholder(str)  # None (typed: overridable)
  c.model.attention_implementation = 'auto'  # dense | chunked | cudnn | auto (chunked for long evals)
  # Scalable softmax (Nakanishi 2025): logits × s_h·log(n), n = keys a query sees,
  # s_h learned per head starting here; 0 = plain softmax. Any encoding.
  c.model.scalable_softmax = 0.0
  # How scores become weights: softmax | stick_breaking (Tan et al. 2025: each key,
  # nearest first, takes σ(z) of the stick the later keys left; the rest goes to the
  # query's own value). Any encoding; dense and chunked kernels.
  c.model.normalization = 'softmax'
  # stick_breaking only: query i also breaks a share for key i (the official
  # attend_current; default False, keys j < i).
  c.model.stick_breaking_attend_current = False
  # Precision, Flax's way: every layer computes in model.dtype (float32 | bfloat16;
  # bf16 on a GPU/TPU is --config.model.dtype=bfloat16) and stores its parameters,
  # and so the optimizer's state, in model.param_dtype (float32: master weights).
  # Softmax, RoPE angles, cumulative gates, logits and the loss stay float32 either way.
  c.model.dtype = 'float32'
  c.model.param_dtype = 'float32'
  c.model.rnn_hidden_dim = 128  # seq2seq only: GRU state width
  c.model.bidirectional = False  # seq2seq only: forward + backward GRU encoder
  c.model.attention_score = 'additive'  # seq2seq_attention only: additive (Bahdanau) | dot (Luong)

  c.positions = ml_collections.ConfigDict()  # NAME:randomized and NAME:coupled encodings only
  # randomized: positions from [0, max_position), 0 = 2 × the longest eval sequence;
  # coupled (Cho et al. 2024): ids below max_position, 0 = eval.max_length + 3.
  c.positions.max_position = 0
  c.positions.randomized_eval = 'random'  # evaluation positions: random (as trained) | contiguous (0 … T-1)
  c.positions.draw = 'per_example'  # per_example (ours) | per_batch (the official code: one sorted sample shared by the batch)

  c.train = ml_collections.ConfigDict()
  c.train.seed = 0  # parameters and the training data stream
  c.train.batch_size = 32  # sequences per step
  c.train.num_steps = 2000  # optimizer steps
  c.train.learning_rate = 3e-3  # AdamW peak learning rate
  c.train.warmup_steps = 100  # linear warm-up from 0
  c.train.final_lr_fraction = 0.1  # cosine decay ends at this fraction of the peak
  c.train.weight_decay = 0.01  # AdamW decoupled weight decay
  c.train.adam_b1 = 0.9  # AdamW β1
  c.train.adam_b2 = 0.98  # AdamW β2
  c.train.grad_clip_norm = 1.0  # global-norm gradient clipping
  c.train.steps_per_call = 10  # steps fused into one compiled call (divides the intervals here)
  c.train.log_every = 100  # steps between host syncs (metrics.jsonl has every step)
  c.train.checkpoint_every = 500  # steps between checkpoints (also saved at the end and on SIGTERM)
  c.train.checkpoint_keep = 2  # newest checkpoints kept per run
  c.train.stop_after = 0  # stop cleanly (checkpointed) after this many steps; 0 = run to num_steps
  # Time box of one invocation, minutes from its start; 0 = none. When it runs out, the
  # runs in training checkpoint and the command exits with status 75 (EX_TEMPFAIL) and
  # the same command continues (a cluster job requeues on it); a study starts no new
  # run and writes no outputs. Checked after every compiled call, not during evaluation.
  c.train.max_minutes = 0.0
  c.train.tensorboard = True  # also write TensorBoard event files (tensorboardX, no TensorFlow)
  # Where the state lives on the devices (lab/train/mesh.py): 'data' replicates it and
  # splits each batch; 'fsdp' splits every weight's embed axis and the batch over all
  # devices; 'tensor' splits heads, MLP units and vocabulary over `model_parallel` devices
  # (0: all) and the batch over the rest. The same training up to float rounding.
  c.train.mesh = 'data'
  c.train.model_parallel = 0  # devices on the 'model' axis of train.mesh='tensor'; 0 = all

  c.eval = ml_collections.ConfigDict()
  c.eval.max_length = 64  # longest evaluated input (8 × train_max_length)
  c.eval.lengths = ()  # input lengths to evaluate; () = 1…L_train, then a sparser grid
  c.eval.num_samples = 256  # sequences per length
  c.eval.batch_size = 256  # sequences per compiled evaluation call
  c.eval.seed = 12345  # evaluation data, shared by every model
  c.eval.generate = True  # also score by greedy generation with the key/value cache
  # Every length padded to the longest: one compiled program per model (and
  # one for generation) instead of one per bucket; for presets whose time is
  # compiling (tiny).
  c.eval.one_bucket = False
  c.eval.rope_scalings = ('pi', 'ntk', 'yarn')  # 'rope' models: also evaluated with each (rows rope+pi, …)
  c.eval.rope_scale_factor = 0.0  # eval.rope_scalings' factor s; 0 = longest eval / longest training sequence

  c.study = ml_collections.ConfigDict()
  c.study.tasks = tasks  # tasks swept by length_extrapolation.py
  c.study.models = ('transformer',)  # model kinds swept; encodings apply to transformers
  # Entries swept (attention_jax/lab/config/entries.py: BASE[:PART…]), one label each.
  c.study.encodings = (preset['encoding'],) if preset['encoding'] else study['encodings']
  # Named variants an entry may name (VARIANTS above): fields of model, task and
  # train that replace the config's for that entry's runs.
  c.study.variants = ml_collections.ConfigDict(VARIANTS)
  # Training seeds swept (overrides train.seed), distinct integers >= 0; three seeds are
  # --config.study.seeds='(0,1,2)' (a bare 3 is the one seed 3).
  c.study.seeds = (0, 1, 2)
  c.study.vmap_seeds = True  # train the seeds of one setup in one compiled program (jax.vmap); False: one after another
  # Setups (task × model × encoding) trained and evaluated at once, in threads:
  # XLA runs their programs side by side, filling cores one small model leaves
  # idle (see attention_jax/lab/runs/timing.py); 1 = one after another. Same results.
  c.study.parallel_setups = 2
  # A run directory trained with another config (a field that changes the
  # trained model, see attention_jax/lab/config/identity.py): 'error' refuses it,
  # 'retrain' trains into a fresh sibling directory (seed0-2, …).
  c.study.on_mismatch = 'error'
  # A run directory another process is training (its .lock names host and pid):
  # 'refuse' (one line naming the holder; a study leaves that run to it) | 'wait'.
  c.study.on_locked = 'refuse'
  # (INDEX, COUNT): train shard INDEX of COUNT of the sweep, e.g. "(0,4)" (runs
  # sorted by name, dealt round-robin; the stacked seeds of a setup stay together);
  # () = SLURM_ARRAY_TASK_ID/COUNT when set, else every run. The outputs are
  # written by whichever shard finishes the sweep's last run.
  c.study.shard = ()
  # Train nothing; write results.csv, summary.md and the figure from the finished
  # runs (refused, naming one, if a run is unfinished): a report step after an array.
  c.study.report_only = False
  # Modules imported before anything else, e.g. one that registers its own
  # encoding with attention_jax.register_encoding (--config.imports="('mypkg.encodings',)").
  c.imports = ()
  c.progress = True  # show a progress bar (process 0 only)
  c.distributed = False  # multi-host: call jax.distributed.initialize() first
  c.deterministic_gpu = False  # GPU: --xla_gpu_deterministic_ops=true (slower, reproducible)

  if preset['scale'] == 'paper':
    c.model.update(d_model=64, num_heads=8, num_layers=5, mlp_dim=256)
    c.task.train_max_length = 40
    c.train.update(batch_size=128, num_steps=10_000, learning_rate=1e-3, warmup_steps=1000)
    c.eval.max_length = 500
    c.eval.batch_size = 64  # × 10 stacked seeds per call: 640 sequences of up to 1,502 tokens
    c.study.seeds = tuple(range(10))
    # One setup at a time: side by side fills CPU cores, and on an accelerator
    # it would hold two setups' 10 stacked seeds in memory at once.
    c.study.parallel_setups = 1
  elif preset['scale'] == 'tiny':
    c.model.update(d_model=16, num_heads=2, num_layers=1, mlp_dim=32)
    c.task.train_max_length = 4
    c.train.update(batch_size=8, num_steps=5, warmup_steps=1, log_every=5, tensorboard=False,
                   steps_per_call=1)
    c.eval.update(max_length=8, num_samples=4, batch_size=4, rope_scalings=(), one_bucket=True)
    c.study.seeds = (0,)
    c.study.variants = ml_collections.ConfigDict(entries.tiny_variants(VARIANTS))
    c.study.variants.rnope_swa.model.num_layers = 2  # a hybrid needs a layer of each kind
    c.progress = False
  if preset['study'] == 'generalize' and preset['scale'] == 'cpu':
    c.eval.lengths = (1, 2, 4, 8, 10, 16, 32, 64)  # the checkpoints that matter, not every length
    c.eval.rope_scalings = ()  # no PI/NTK/YaRN rows: coupled ids stay in the trained range
  if preset['encoding']:  # the one run (train.py) is that entry too
    c = entry_config(c, preset['encoding'])
  return c
