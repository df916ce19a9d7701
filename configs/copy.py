r"""Length extrapolation on synthetic copy tasks: train short, test long.

The default preset is the study `make experiment` runs on a 2-core CPU:

  python -m experiments.length_extrapolation --config=configs/copy.py \
      --workdir=runs/copy

It trains 36 models (encodings none, sinusoidal, learned, rope, alibi,
hard_alibi, learned_window, fire, fox, rope:coupled, windowed_rope:coupled
and the variant mta_lookup (VARIANTS below) × seeds 0, 1, 2; the seeds of
one encoding in one compiled program, two encodings side by side) on `copy`
with inputs of length 1–8, evaluates every model at 15 input lengths from 1
to 64 (1–8, then 1.25×, 1.5×, 2×, 3×, 4×, 6×, 8× the training maximum) under
teacher forcing and by greedy generation, evaluates the RoPE models again
with three context extensions (rows rope+pi, rope+ntk, rope+yarn; the
official YaRN), and writes results.csv, ceiling.csv (the k-gram ceiling of
the evaluation strings), summary.md and extrapolation.png to the workdir.
Expected: every encoding near 100% token accuracy in the training range;
past it, the curves separate: windowed_rope:coupled (told where to look by
coupled position ids) copies 4× and 8× longer strings exactly, mta_lookup
(told nothing) about 95% of them at 4×; fire and learned_window get about
70% of strings right at 2× (see the README for a real run, its numbers and
its wall time: about 14 minutes on a 2-core CPU).

One model: `python -m experiments.train --config=configs/copy.py:encoding=rope
--workdir=runs/one`. Presets by `:arg`, comma-separated `key=value`:

  encoding=NAME  the encoding (train.py) / the only encoding swept
              (length_extrapolation.py): a registry name (none, sinusoidal,
              learned, rope, alibi, t5, kerple, hard_alibi, learned_window,
              windowed_rope, fire, cope, xpos, p_rope, fox, dape, mta), or a
              variant's name (mta_lookup, ngram_lookup: VARIANTS below), optionally
              NAME:randomized (Ruoss et al. 2023) or NAME:coupled (position
              coupling, Cho et al. 2024), and SPEC+stick_breaking for
              stick-breaking attention (model.normalization)
  task=NAME   copy | reverse | duplicate
  size=NAME   cpu (default) | paper (Delétang et al. 2022 / Ruoss et al. 2023:
              5 layers, d_model 64, 8 heads, batch 128, train lengths 1–40,
              evaluation to 500, 10 seeds; for GPU/TPU) | tiny (the tests' smoke run:
              5 steps, mostly compiling; README gives its time)
              | generalize (issue 12's CPU recipe: windowed_rope:coupled, every
              head RoPE + a window |Δid| <= 2 on coupled position ids + a
              sink at id 0; measured 100.0 ± 0.0% exact match at 4× and at
              8× L_train, 3 seeds, 3 min for the whole study) | all (every
              encoding of ALL_ENCODINGS on copy, reverse and duplicate: 189
              runs; the 180 before mta_lookup joined about 113 minutes on the
              2-core CPU, measured in two parts (the 117 older runs 77
              minutes, the frontier's 36; mta_lookup's 9: 11 minutes);
              windowed_rope:coupled 100.0 ± 0.0% exact at 4× and 8× on all
              three tasks; see the README) | frontier (FRONTIER only, the
              2024-25 methods, on the three tasks: 63 runs, 36 minutes;
              best: fire, 67.6 ± 3.6% exact at 2× on copy, 1.8% at 4×)

Any field can be overridden: `--config.model.num_heads=8`.
"""

import ml_collections

# The default study: the lesson's four encodings and NoPE, the published
# windowed recipe (Hard-ALiBi), our learned window, two 2024-25 methods (FIRE,
# the best of them past L_train on copy in `size=frontier`, and forgetting
# attention, a data-dependent ALiBi), and coupled ids with RoPE, unwindowed
# and windowed (ours: the one that generalizes).
ENCODINGS = ('none', 'sinusoidal', 'learned', 'rope', 'alibi', 'hard_alibi',
             'learned_window', 'fire', 'fox', 'rope:coupled', 'windowed_rope:coupled',
             'mta_lookup')
# Every encoding of the project (`:size=all`): the above, the research
# relative biases and randomized positions.
# The 2024-25 methods (`:size=frontier`): FIRE, CoPE, xPos, p-RoPE, forgetting
# attention, DAPE, and stick-breaking attention with no encoding (as its paper
# trains it); 'SPEC+stick_breaking' is SPEC with model.normalization=stick_breaking.
STICK_BREAKING = '+stick_breaking'  # the suffix (attention_jax.lab.models.STICK_BREAKING_SUFFIX)
FRONTIER = ('fire', 'cope', 'xpos', 'p_rope', 'fox', 'dape', 'none+stick_breaking')
# Named variants of the default model (study.variants): a study entry (or
# `:encoding=NAME`) naming one trains the default model with these fields
# replaced, labelled NAME. Two that copy by content alone (no coupling, no
# position ids: nothing tells them where to look; see the README):
# * mta_lookup: one layer of Multi-Token Attention's key-query convolution
#   (positional/mta.py) on NoPE scores, reading this query and the 5 before it ×
#   this key and the 5 before it (pad_key='left': no later key), so one weight
#   matches the last few tokens against the few before a key: an n-gram lookup
#   in one head, and nothing else for a length to leak into (two layers of it:
#   65.5% exact at 4×, 3 seeds, with a second layer that drifts; see the README).
#   3,000 steps instead of 2,000: 98.8% exact at 4× instead of 94.7% (3 seeds).
#   Changes against the default model: encoding mta with this kernel, 1 layer
#   instead of 2, 3,000 steps instead of 2,000. Runtime in the default study: 35 s
#   of training for its 3 seeds and 10 s of scoring, the cheapest setup there.
# * ngram_lookup: Hard-ALiBi's windows shifted (hard_alibi offsets): four heads
#   each read exactly one earlier token (1 … 4 back), so every position holds
#   its last five tokens in order, and a fifth, NoPE head looks them up;
#   scalable softmax. It matches four tokens in one dot product, so its head
#   width decides: 81% at 4× with 32 (d_model 160), 87% with 64 (seed 0).
#   Changes: 5 heads, d_model 160, mlp_dim 640, lr 1e-3, scalable softmax 0.4;
#   3 seeds on copy in 4 min (training and scoring).
_MTA_LOOKUP = dict(encoding='mta', num_layers=1, encoding_options=dict(
    mta=dict(query_kernel_size=6, key_kernel_size=6, pad_key='left')))
_NGRAM_LOOKUP = dict(encoding='hard_alibi', num_heads=5, d_model=160, mlp_dim=640,
                     scalable_softmax=0.4, encoding_options=dict(
                         hard_alibi=dict(widths=(1, 1, 1, 1), offsets=(1, 2, 3, 4))))
VARIANTS = {
    'mta_lookup': dict(model=_MTA_LOOKUP, train=dict(num_steps=3000)),
    'ngram_lookup': dict(model=_NGRAM_LOOKUP, train=dict(learning_rate=1e-3)),
}
ALL_ENCODINGS = ENCODINGS + ('t5', 'kerple', 'learned:randomized', 'rope:randomized') + tuple(
    e for e in FRONTIER if e not in ENCODINGS)


def _parse(arg):
  preset = dict(encoding=None, task='copy', size='cpu')
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in preset or not value:
      raise ValueError(
          f'bad config argument {item!r}; expected key=value with key in '
          f'{sorted(preset)}, e.g. configs/copy.py:encoding=rope,size=paper.')
    preset[key] = value
  if preset['size'] not in ('cpu', 'paper', 'tiny', 'generalize', 'all', 'frontier'):
    raise ValueError(f"size={preset['size']!r}: choose cpu, paper, tiny, generalize, all or "
                     'frontier.')
  return preset


def get_config(arg=None):
  preset = _parse(arg)
  c = ml_collections.ConfigDict()

  c.task = ml_collections.ConfigDict()
  c.task.name = preset['task']  # copy | reverse | duplicate
  c.task.vocab_size = 16  # symbols in x (special tokens BOS/SEP/EOS/PAD come on top)
  c.task.train_min_length = 1  # shortest training input, inclusive
  c.task.train_max_length = 8  # longest training input, inclusive ("L_train")
  # Examples packed back to back into one training sequence (Jelassi et al.
  # 2024: earlier examples are distractors, later ones sit at large positions);
  # the loss covers every example's outputs. Evaluation: one per sequence.
  c.task.pack = 1

  c.model = ml_collections.ConfigDict()
  c.model.kind = 'transformer'  # transformer | seq2seq | seq2seq_attention (GRU, lesson 7.1)
  # A registry name (attention_jax.ENCODINGS), or NAME:randomized to train on
  # randomized positions (Ruoss et al. 2023; see `positions` below).
  c.model.encoding = (preset['encoding'] or 'rope').removesuffix(STICK_BREAKING)
  if preset['encoding'] in VARIANTS:
    c.model.encoding = VARIANTS[preset['encoding']]['model']['encoding']
  # Keyword options per encoding, passed to its `build` when that encoding
  # is used: model.encoding_options.NAME.OPTION (--config.model.encoding_options.t5.num_buckets=64).
  c.model.encoding_options = ml_collections.ConfigDict()
  c.model.encoding_options.t5 = ml_collections.ConfigDict(dict(
      num_buckets=32,  # learned relative-distance buckets per head
      max_distance=128,  # distances from here on share the last bucket
  ))
  # Hard-ALiBi (Jelassi et al. 2024): head h < len(widths) sees only keys
  # with 0 <= i - j < widths[h], the other heads are NoPE; official: 1, 2, …, M.
  # offsets (ours, one per windowed head, default 0): head h sees offsets[h] <= i - j <
  # offsets[h] + widths[h]; width 1 at offset d reads exactly the token d back.
  c.model.encoding_options.hard_alibi = ml_collections.ConfigDict(dict(widths=(1, 2),
                                                                       offsets=()))
  c.model.encoding_options.learned_window = ml_collections.ConfigDict(dict(
      init_widths=(1, 2),  # one trained soft window per entry, from these widths; other heads NoPE
      temperature=4.0,  # initial edge sharpness τ (bias log σ(τ (w − ½ − d)))
      learn_temperature=True,  # train τ too (else fixed)
  ))
  # FIRE (Li et al. 2024, positional/fire.py): bias f_θ(ψ(i − j) / ψ(max(L, i))),
  # ψ(x) = log(|c·x| + 1); defaults are the reference port's (mcleish7/arithmetic).
  c.model.encoding_options.fire = ml_collections.ConfigDict(dict(
      mlp_width=32,  # hidden units of the MLP f_θ (1 → width → num_heads, ReLU)
      init_c=0.1,  # initial c of the log transform ψ (learned)
      # L₀ of the threshold L = |s·L₀| (s learned from 1). Queries at i < L are
      # normalised by ψ(L): with 512 every query at eval.max_length=64 is (at most
      # 194 positions read), so the bias starts as a function of i − j alone; set
      # it near the training length to let longer inputs interpolate (ψ(i − j)/ψ(i)).
      init_threshold=512.0,
      eps=1e-6,  # added to the normaliser ψ(max(L, i))
  ))
  # windowed_rope (ours, positional/windowed_rope.py): RoPE, and each windowed
  # head sees only keys with |Δid| <= its width: with coupled ids
  # ('windowed_rope:coupled') a bounded, length-independent neighbourhood.
  c.model.encoding_options.windowed_rope = ml_collections.ConfigDict(dict(
      windows=(),  # one width per windowed head; () = `window` for each
      window=2,  # |Δid| <= 2: x_{k+1} (Δ = −1) plus a margin; 1 also gave 100% at 4×/8× (seed 0)
      # -1 = all heads windowed. A plain RoPE head sees the whole length: with 2 of
      # the 4 heads plain, 53.1% exact at 4× (early EOS from k ≈ 19 on), seed 0.
      num_windowed_heads=-1,
      # Keys at id 0 (BOS/EOS/PAD) open to every windowed head: where "no
      # x_{k+1}" puts its attention, so EOS is not confused with x_{k+1} = x_k
      # (without it: early EOS inside runs like 'cccc', 98.8% exact at 8×).
      sink=True,
  ))
  # p-RoPE (Barbero et al. 2025, positional/p_rope.py): RoPE on the ⌊p·D/2⌋
  # highest frequencies (exponents over the full head_dim), the rest unrotated.
  c.model.encoding_options.p_rope = ml_collections.ConfigDict(dict(
      p=0.75,  # fraction of the D/2 frequencies rotated: the paper's best; 1 = rope, 0 = none
      base=10000.0,  # RoPE's base: θ_i = base^(-2i/D)
  ))
  # xPos (Sun et al. 2023, positional/xpos.py): RoPE, q·k pair i scaled by
  # ζ_i^((m − n)/scale_base), ζ_i = (2i + 0.4D)/(1.4D); causal attention only.
  c.model.encoding_options.xpos = ml_collections.ConfigDict(dict(
      base=10000.0,  # RoPE's base: θ_i = base^(-2i/D) (the official code's fixed 10,000)
      scale_base=512.0,  # γ: the decay per position is ζ^(1/γ); the official 512
      # Fixed position whose scales are 1 (ours; the official centres on the length,
      # which a key/value cache cannot): float32 allows |position − centre| <= 17,847.
      centre=0,
  ))
  # FoX, forgetting attention (Lin et al. 2025, positional/forgetting.py): per head a
  # gate f_t = σ(w·x_t + b) of the layer input; scores get Σ_{l=j+1..i} log f_l. One per layer.
  c.model.encoding_options.fox = ml_collections.ConfigDict(dict(
      weight_std=0.02,  # std of the gate kernel's normal init (the official initializer_range)
      bias_init=0.0,  # initial gate bias, every head: 0 = gates start at σ(0) = 1/2 (official)
      # (T_min, T_max): per-head biases b = −log(expm1(1/t)), t log-spaced, so gates start
      # at exp(−1/t) (the official fgate_bias_init, there for data-independent gates);
      # () = off (bias_init instead).
      decay_times=(),
  ))
  # CoPE (Golovneva et al. 2024, positional/cope.py): key j sits at p = Σ_{t=j..i}
  # σ(q_i·k_t/√D), scores get q_i·e[p]/√D (e interpolated, zeros at the start).
  # O(T²): dense kernel only. One table per layer.
  c.model.encoding_options.cope = ml_collections.ConfigDict(dict(
      # Positions in the table e [head_dim, npos]; p is clamped to npos − 1. None = the
      # model's max_positions + 1 (model.max_positions; 0 there = the longest eval
      # sequence): the official block_size + 1, so nothing is clamped.
      npos=ml_collections.config_dict.placeholder(int),
      nodiv=False,  # True: add q·e[p] to q·k/√D undivided (the official --cope-nodiv)
  ))
  # DAPE (Zheng et al. 2024, positional/dape.py): scores get B + f(q·k/√D, B), B a
  # base bias, f an MLP 2H → mlp_width → H (LeakyReLU) at every (i, j), over the heads.
  # O(T²): dense kernel only. One MLP (and KERPLE's p, a) per layer.
  # Multi-Token Attention (Golovneva et al. 2025, positional/mta.py): NoPE scores
  # convolved over this query and c_q − 1 before it × c_k keys around each key, a
  # learned kernel per head and layer starting as the identity. O(T²): dense only.
  c.model.encoding_options.mta = ml_collections.ConfigDict(dict(
      query_kernel_size=6,  # c_q (the official configs' 6)
      key_kernel_size=11,  # c_k (official 11; odd with pad_key='both')
      pad_key='both',  # keys read: 'both' (j − 5 … j + 5 for 11, official) | 'left' (earlier) | 'right'
  ))
  c.model.encoding_options.dape = ml_collections.ConfigDict(dict(
      base='kerple',  # the bias B: 'kerple' (−p·log(1 + a·|i − j|), learned) | 'alibi' (fixed slopes)
      mlp_width=32,  # hidden units of f (the official configs' mlp_width)
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
  c.model.attention_implementation = 'auto'  # dense | chunked | cudnn | auto (chunked for long evals)
  # Scalable softmax (Nakanishi 2025): logits × s_h·log(n), n = keys a query sees,
  # s_h learned per head starting here; 0 = plain softmax. Any encoding.
  c.model.scalable_softmax = 0.0
  # How scores become weights: softmax | stick_breaking (Tan et al. 2025: each key,
  # nearest first, takes σ(z) of the stick the later keys left; the rest goes to the
  # query's own value). Any encoding; dense and chunked kernels.
  c.model.normalization = ('stick_breaking' if (preset['encoding'] or '').endswith(STICK_BREAKING)
                           else 'softmax')
  # stick_breaking only: query i also breaks a share for key i (the official
  # attend_current; default False, keys j < i).
  c.model.stick_breaking_attend_current = False
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

  c.eval = ml_collections.ConfigDict()
  c.eval.max_length = 64  # longest evaluated input (8 × train_max_length)
  c.eval.lengths = ()  # input lengths to evaluate; () = 1…L_train, then a sparser grid
  c.eval.num_samples = 256  # sequences per length
  c.eval.batch_size = 256  # sequences per compiled evaluation call
  c.eval.seed = 12345  # evaluation data, shared by every model
  c.eval.generate = True  # also score by greedy generation with the key/value cache
  c.eval.rope_scalings = ('pi', 'ntk', 'yarn')  # 'rope' models: also evaluated with each (rows rope+pi, …)
  c.eval.rope_scale_factor = 0.0  # eval.rope_scalings' factor s; 0 = longest eval / longest training sequence

  c.study = ml_collections.ConfigDict()
  c.study.tasks = (preset['task'],)  # tasks swept by length_extrapolation.py
  c.study.models = ('transformer',)  # model kinds swept; encodings apply to transformers
  c.study.encodings = (preset['encoding'],) if preset['encoding'] else ENCODINGS  # encodings swept
  # Named variants a study.encodings entry may name (VARIANTS above): fields of
  # model, task and train that replace the config's for that entry's runs.
  c.study.variants = ml_collections.ConfigDict(VARIANTS)
  # Training seeds swept (overrides train.seed), distinct integers >= 0; three seeds are
  # --config.study.seeds='(0,1,2)' (a bare 3 is the one seed 3).
  c.study.seeds = (0, 1, 2)
  c.study.vmap_seeds = True  # train the seeds of one setup in one compiled program (jax.vmap); False: one after another
  # Setups (task × model × encoding) trained and evaluated at once, in threads:
  # XLA runs their programs side by side, filling cores one small model leaves
  # idle (see attention_jax/lab/timing.py); 1 = one after another. Same results.
  c.study.parallel_setups = 2
  # A run directory trained with another config (a field that changes the
  # trained model, see attention_jax/lab/identity.py): 'error' refuses it,
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

  if preset['size'] == 'paper':
    c.model.update(d_model=64, num_heads=8, num_layers=5, mlp_dim=256)
    c.task.train_max_length = 40
    c.train.update(batch_size=128, num_steps=10_000, learning_rate=1e-3, warmup_steps=1000)
    c.eval.max_length = 500
    c.study.seeds = tuple(range(10))
  elif preset['size'] == 'generalize':
    # Position coupling (Cho et al. 2024): y_k carries x_k's id, so the query
    # predicting y_{k+1} (id s + k) must read x_{k+1}, one id ahead, at any length.
    c.model.encoding = preset['encoding'] or 'windowed_rope:coupled'
    c.study.encodings = (c.model.encoding,)  # the recipe alone
    # windowed_rope (positional/windowed_rope.py): RoPE, and each windowed head
    # sees only keys with |Δid| <= its width, so a head reads a bounded,
    # length-independent neighbourhood: nothing far away can distract it.
    c.task.pack = 1  # one example per sequence: enough (pack 4 also gave 100% at 4×/8×, seed 0, but trains 4× slower)
    c.eval.lengths = (1, 2, 4, 8, 10, 16, 32, 64)  # the checkpoints (faster than every length)
    c.eval.rope_scalings = ()  # no PI/NTK/YaRN rows: coupled ids stay in the trained range
    c.study.seeds = (0, 1, 2)  # measured: 100.0 ± 0.0% exact at 32 and at 64 (train ~40–70 s each)
  elif preset['size'] in ('all', 'frontier'):
    # The default model on every task, with every encoding of the project
    # ('all') or the 2024-25 methods only ('frontier': the same runs as
    # those of 'all', so one workdir can hold both).
    c.study.tasks = ('copy', 'reverse', 'duplicate')
    swept = ALL_ENCODINGS if preset['size'] == 'all' else FRONTIER
    c.study.encodings = (preset['encoding'],) if preset['encoding'] else swept
  elif preset['size'] == 'tiny':
    c.model.update(d_model=16, num_heads=2, num_layers=1, mlp_dim=32)
    c.task.train_max_length = 4
    c.train.update(batch_size=8, num_steps=5, warmup_steps=1, log_every=5, tensorboard=False,
                   steps_per_call=1)
    c.eval.update(max_length=8, num_samples=4, batch_size=4, rope_scalings=())
    c.study.seeds = (0,)
    c.progress = False
  if preset['encoding'] in VARIANTS and preset['size'] != 'generalize':  # one run (train.py) too
    c.update(VARIANTS[preset['encoding']])
    c.model.variant = preset['encoding']
  return c
