r"""DeepMind's length-generalization benchmark: 15 tasks across the Chomsky
hierarchy (Delétang et al. 2023), every output written at once by a
bidirectional encoder, positional encodings compared as Ruoss et al. 2023
compare them (google-deepmind/randomized_positional_encodings).

  python -m experiments.chomsky --config=configs/chomsky.py --workdir=runs/chomsky

The default, `scale=cpu`, runs the whole suite on a 2-core CPU: 15 tasks × 9
encodings (none, sinusoidal, relative, alibi, rope and the randomized
versions of the last four) × 3 seeds, reduced as docs/chomsky.md explains
(2 layers of width 32 instead of 5 of 64, training lengths 1–10 instead of
1–40, test lengths 11–40 instead of 41–500, 1,000 steps of batch 16, 64 test
samples per length, one learning rate). It
writes per-setting records under `settings/`, results.csv, summary.md (a
table per task and the published numbers beside ours) and chomsky.png (tasks
× encodings grouped by Chomsky level). Expected (docs/chomsky.md has the
measured run: 19 min 55 s in a fresh clone of 00fbaa3, alone on the 2-core
CPU, 2026-12-05): the randomized versions ahead of the plain ones by 2.4–5.6
points on average, most on bucket_sort (72–84% against 19–71%) and
even_pairs (randomized relative and RoPE 80–85%); the
regular tasks but even_pairs, and most others, near chance past the
training lengths at this scale.
Re-running the command skips finished settings.

Presets by `:arg`, comma-separated `key=value`:

  scale=NAME      cpu (default) | paper (the published setting: 5 layers,
                  d_model 64, 8 heads, batch 128, lengths 1–40 then 1–500
                  with 512 samples each, their learning-rate grid, seeds and
                  steps; for accelerators; not yet run) | tiny (the tests'
                  smoke run: 4 steps of every one of the 135 settings, 2
                  seeds, two groups at a time; 3 min 22 s in a fresh clone
                  of 0036474, alone on the 2-core CPU, 2026-12-05, nearly
                  all of it compiling: each task's data generators once,
                  then a few programs per encoding and task shape; the
                  tests run 2 tasks × 3 encodings of it)
  tasks=A+B       a subset of the 15, or any task of attention_jax.lab.tasks.SPECS
                  (copy, reverse and duplicate too, alphabet 16)
  encodings=A+B   a subset or others (any registry name that runs
                  bidirectionally, with :randomized for those their code
                  randomizes)

Any field can be overridden: `--config.train.num_steps=2000`. The field
names are the copy study's (configs/copy.py): `task.train_min_length`,
`task.train_max_length`, `positions.max_position`, `train.num_steps`,
`train.steps_per_call`, `train.checkpoint_every`, `train.stop_after`,
`train.max_minutes`, `eval.num_samples`, `eval.batch_size`, `study.seeds`,
`study.shard`, `study.on_locked`, `study.report_only`. A workdir written
when the suite named three of them otherwise (`train.min_length`,
`train.max_length`, `model.noise_max_length`) is read with today's names.

At scale: a setting's training is checkpointed every
`train.checkpoint_every` steps (an interrupt loses at most that many; the
same command resumes, bit for bit), a SLURM array (or
`--config.study.shard="(INDEX,COUNT)"`) splits the groups of settings
between jobs, one job at a time per group (a lock), and `train.max_minutes`
ends an invocation cleanly (checkpointed, exit status 75) for a job that
requeues itself.
"""

import ml_collections

from attention_jax.lab.config import preset_arguments

TASKS = ('even_pairs', 'modular_arithmetic', 'parity_check', 'cycle_navigation',
         'stack_manipulation', 'reverse_string', 'modular_arithmetic_brackets',
         'solve_equation', 'duplicate_string', 'missing_duplicate_string', 'odds_first',
         'binary_addition', 'binary_multiplication', 'compute_sqrt', 'bucket_sort')
# Ruoss et al. 2023's comparison: each encoding plain and randomized
# (learned is in their table too; add 'learned', 'learned:randomized').
ENCODINGS = ('none', 'sinusoidal', 'relative', 'alibi', 'rope', 'sinusoidal:randomized',
             'relative:randomized', 'alibi:randomized', 'rope:randomized')


def get_config(arg=None):
  options = preset_arguments.parse(
      arg, dict(scale='cpu', tasks=TASKS, encodings=ENCODINGS), choices=dict(scale=SCALES),
      lists=('tasks', 'encodings'), example='configs/chomsky.py:scale=tiny,tasks=parity_check')
  c = ml_collections.ConfigDict()
  # How a model reads its tasks and is scored: 'encoder' (every output
  # written at once into blank slots, DeepMind's) | 'decoder' (configs/copy.py).
  c.protocol = 'encoder'
  c.study = ml_collections.ConfigDict()
  c.study.tasks = tuple(options['tasks'])  # any of attention_jax.lab.tasks.SPECS
  c.study.encodings = tuple(options['encodings'])  # registry names, NAME:randomized
  c.study.seeds = (0, 1, 2)  # each draws a model's parameters and its training data
  # A grid: the setting's score is the best run over seeds × rates.
  c.study.learning_rates = (1e-3,)
  # (INDEX, COUNT): train the groups of settings of shard INDEX of COUNT (a
  # cluster array); () = from SLURM's array variables if set, else all.
  c.study.shard = ()
  c.study.on_locked = 'refuse'  # a group another job trains: 'refuse' (one line) or 'wait'
  c.study.report_only = False  # write the outputs from the recorded settings; train nothing
  # Groups trained and evaluated at once, in threads: XLA compiles and runs
  # two groups' programs side by side, filling the cores one small group
  # leaves idle; 1 = one after another. The same records either way.
  c.study.parallel_setups = 1

  c.task = ml_collections.ConfigDict()
  # One training length per batch, uniform in [train_min_length, train_max_length].
  c.task.train_min_length = 1  # theirs: 1
  c.task.train_max_length = 40  # theirs: 40

  c.positions = ml_collections.ConfigDict()
  # NAME:randomized draws its positions from [0, this) (their noise_max_length).
  c.positions.max_position = 2048  # theirs: 2,048

  c.model = ml_collections.ConfigDict()
  c.model.num_layers = 5  # theirs: 5
  c.model.d_model = 64  # theirs: 64
  c.model.num_heads = 8  # theirs: 8
  c.model.mlp_factor = 4  # FFN width / d_model; theirs: 4
  c.model.dropout = 0.1  # on embeddings and both residual branches; theirs: 0.1
  # Per-encoding build options. ALiBi bidirectional with their +0.5 for keys
  # left of the query (their compute_alibi_encodings_biases).
  c.model.encoding_options = ml_collections.ConfigDict({'alibi': {'left_offset': 0.5}})

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 10_000  # optimizer steps; set by the scale
  c.train.steps_per_call = 100  # steps per compiled call (divides the step counts here)
  c.train.log_every = 500  # progress line every this many steps
  c.train.checkpoint_every = 5_000  # steps between checkpoints of a group in training
  c.train.checkpoint_keep = 2  # newest checkpoints kept per group
  c.train.stop_after = 0  # stop cleanly (checkpointed) when a group reaches this step; 0: never
  # Every compiled call's loss and accuracy (mean and per task × seed) go to
  # groups/…/metrics.jsonl; True also writes TensorBoard files beside it.
  c.train.tensorboard = True
  # Minutes this invocation may train before it stops cleanly (checkpointed,
  # exit status 75: run it again to continue); 0: no limit.
  c.train.max_minutes = 0.0
  c.train.batch_size = 128  # theirs: 128
  c.train.grad_clip_norm = 1.0  # global-norm clipping before Adam; theirs: 1.0
  # K > 0: each step padded to its length's bucket (the training lengths in K
  # equal ranges) instead of the longest length, and one length per step for
  # the whole run rather than per seed (attention_jax/lab/train/suite_programs.py);
  # 0: theirs, every batch at the longest length's slots.
  c.train.length_buckets = 0

  c.eval = ml_collections.ConfigDict()
  c.eval.min_length = 1  # every length min … max is evaluated (theirs: 1 …)
  c.eval.max_length = 500  # theirs: 500
  c.eval.num_samples = 512  # examples per length; theirs: 512
  c.eval.batch_size = 64  # examples per forward pass; theirs: 64 (their score averages these)
  c.eval.seed = 1  # evaluation data, the same for every run; theirs: 1
  c.eval.bucket = 50  # lengths padded to multiples of this (one compile each); 0: one
  c.eval.cache = False  # keep the evaluation data for the next encoding (memory: all of it)
  # False: dropout (model.dropout) stays on at evaluation, as in theirs (their
  # model has no train/eval switch; range_evaluation.py applies it with a random
  # key), its keys drawn from eval.seed and the length (reproducible); True: off.
  c.eval.deterministic = False

  # What entry_point reads (every experiment's config has them).
  c.deterministic_gpu = False  # bitwise-reproducible GPU runs (slower)
  c.distributed = False  # jax.distributed.initialize() first (multi-host)
  c.imports = ()  # modules imported first (e.g. ones registering an encoding)
  SCALES[options['scale']](c)
  return c


def _cpu(c):
  # Reduced to fit 30 minutes on 2 cores; docs/chomsky.md says why each keeps
  # the comparison meaningful.
  c.model.num_layers = 2
  c.model.d_model = 32
  c.model.num_heads = 4
  c.train.num_steps = 1_000
  c.train.log_every = 500
  c.train.checkpoint_every = 500
  c.train.batch_size = 16
  c.task.train_max_length = 10
  c.eval.min_length = 11
  c.eval.max_length = 40
  c.eval.num_samples = 64
  c.eval.batch_size = 64
  c.eval.bucket = 20
  c.eval.cache = True
  c.positions.max_position = 256


def _paper(c):
  # The Chomsky runs' settings as the authors give them in
  # google-deepmind/neural_networks_chomsky_hierarchy issue #7 (2024-01-26):
  # model_init_seed range(10), learning_rate sweep [1e-4, 3e-4, 5e-4],
  # batch 128, 1,000,000 steps, max_grad_norm 1.0, test lengths to 500,
  # uniform curriculum on 1–40, 5 layers of width 64, dropout 0.1; the
  # reported score is the maximum over the 10 seeds (same issue).
  c.study.seeds = tuple(range(10))
  c.study.learning_rates = (1e-4, 3e-4, 5e-4)
  c.train.num_steps = 1_000_000
  c.train.log_every = 10_000
  c.train.steps_per_call = 1_000
  c.train.checkpoint_every = 10_000


def _tiny(c):
  c.study.parallel_setups = 2  # its time is compiling: two groups compile at once
  c.model.num_layers = 1
  c.model.d_model = 16
  c.model.num_heads = 2
  c.study.seeds = (0, 1)
  c.train.num_steps = 4
  c.train.steps_per_call = 2
  c.train.log_every = 2
  c.train.checkpoint_every = 2
  c.train.tensorboard = False
  c.train.batch_size = 4
  c.task.train_max_length = 4
  c.eval.max_length = 7
  c.eval.num_samples = 4
  c.eval.batch_size = 2
  c.eval.bucket = 0
  c.positions.max_position = 64


SCALES = {'cpu': _cpu, 'paper': _paper, 'tiny': _tiny}
