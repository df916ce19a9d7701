"""The checks of a config's own fields, before any run is resolved.

Each value is checked against what is allowed (a range, a name in a
registry, an optimizer setting that trains), and so is the model of every
study entry: its encoding spec and options, the attention kernel it asks
for and its layer pattern. What needs the task (the positions a run reads,
Abacus ids, index hints) is checked on each run's record (`run_checks`). A
failure is one `ConfigError` naming the key, its value and what is allowed.
"""

import inspect
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from attention_jax.attention import IMPLEMENTATIONS
from attention_jax.attention import NORMALIZATIONS
from attention_jax.attention import Request
from attention_jax.attention import select_implementation
from attention_jax.attention.scores import as_terms
from attention_jax.lab import tasks
from attention_jax.lab.config.encoding_probe import option_refusal
from attention_jax.lab.config.encoding_probe import probe_encoding
from attention_jax.lab.config.entries import entry_config
from attention_jax.lab.config.entries import variants
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config import facts
from attention_jax.lab.config.facts import MODEL_KINDS
from attention_jax.lab.runs.cluster import check_shard
from attention_jax.lab.train import mesh as train_mesh
from attention_jax.nn.additive import SCORES
from attention_jax.positional import ENCODINGS
from attention_jax.positional import parse_encoding_spec
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.rope import SCALINGS


ON_MISMATCH = ('error', 'retrain')  # study.on_mismatch, see lab/config/identity.py
ON_LOCKED = ('refuse', 'wait')  # study.on_locked, see lab/runs/locks.py
# make_encoding's own arguments; the rest of a `build` signature are options.
_COMMON = {'cls', 'd_model', 'num_heads', 'max_positions', 'causal', 'rngs'}


# Appended where an encoding name is unknown: how one of your own gets there.
IMPORTS_HINT = ('; your own encoding: register it with attention_jax.register_encoding in a '
                'module and name that module in --config.imports=my_module')


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(f'invalid config: {message}')


def _number(value, ok, key: str, allowed: str) -> None:
  _require(isinstance(value, (int, float)) and not isinstance(value, bool) and ok(value),
           f'{key}={value!r} must be {allowed}.')


def _check_optimizer(tr) -> None:
  """Values the optimizer would take without complaint and train nonsense with."""
  _number(tr.learning_rate, lambda v: v > 0, 'train.learning_rate', '> 0')
  _number(tr.weight_decay, lambda v: v >= 0, 'train.weight_decay', '>= 0')
  _number(tr.warmup_steps, lambda v: 0 <= v <= tr.num_steps, 'train.warmup_steps',
          f'in 0…train.num_steps={tr.num_steps}')
  _number(tr.grad_clip_norm, lambda v: v > 0, 'train.grad_clip_norm', '> 0')
  _number(tr.final_lr_fraction, lambda v: 0 <= v <= 1, 'train.final_lr_fraction', 'in [0, 1]')
  for name in ('adam_b1', 'adam_b2'):
    _number(tr[name], lambda v: 0 <= v < 1, f'train.{name}', 'in [0, 1)')
  _number(tr.checkpoint_keep, lambda v: v >= 1, 'train.checkpoint_keep', '>= 1')
  for name in ('checkpoint_every', 'stop_after'):
    _number(tr[name], lambda v: v >= 0, f'train.{name}', '>= 0')
  _number(tr.get('max_minutes', 0), lambda v: v >= 0, 'train.max_minutes',
          '>= 0 (minutes of this invocation; 0 = no limit)')


def _check_option_values(m, name: str, values) -> None:
  """Builds encoding `name` with its listed options, also where no run uses
  it: a bad value is refused now, not when a later run names the encoding.
  Only an error naming one of the options is; others (a head_dim the
  encoding cannot take) concern the runs that use it, checked below."""
  options = dict(values or {})
  if not options:
    return
  try:
    probe_encoding(name, m, None, options)
  except (ValueError, TypeError) as e:
    refusal = option_refusal(name, options, e)
    _require(refusal is None, refusal)


def _check_encoding_options(m) -> None:
  """Every model.encoding_options.NAME names an encoding, every option one
  its `build` takes, and every value one it accepts (else the model would
  fail when built, files written)."""
  options = m.get('encoding_options')
  for name, values in (options or {}).items():
    _require(name in ENCODINGS, f'model.encoding_options has {name!r}; allowed: '
             f'{sorted(ENCODINGS)}{IMPORTS_HINT}.')
    parameters = inspect.signature(ENCODINGS[name].build).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
      continue
    allowed = sorted(set(parameters) - _COMMON)
    for option in values or {}:
      _require(option in allowed, f'model.encoding_options.{name}.{option}: {name!r} takes '
               f'{allowed or "no options"}.')
    _check_option_values(m, name, values)


def _score_spec(encoding, d_model: int, num_heads: int, positions: np.ndarray):
  """What `encoding` adds to a causal self-attention call at `positions`, as
  a module asks it (`score_contribution`, so that encodings reading q, k or
  token features answer too), on zero inputs: only the spec's kind matters."""
  t = len(positions)
  qk = jnp.zeros((1, t, num_heads, d_model // num_heads), jnp.float32)
  features = encoding.token_features(jnp.zeros((1, t, d_model), jnp.float32))
  return encoding.score_contribution(ScoreContext(
      q=qk, k=qk, q_positions=positions, k_positions=positions, q_slots=np.arange(t),
      q_features=features, k_features=features, causal=True))


def kernel_refusal(config: ml_collections.ConfigDict, spec: str) -> Optional[str]:
  """Why model.attention_implementation cannot run encoding `spec`, asked of
  the library: the encoding says what it adds to the scores (at positions
  0 … T-1, or drawn ones for NAME:modifier), the kernel table whether the
  named kernel serves that. None if it can."""
  m = config.model
  if m.attention_implementation not in IMPLEMENTATIONS:
    return (f'model.attention_implementation={m.attention_implementation!r}: choose one of '
            f'{IMPLEMENTATIONS}.')
  name, _, modifier = spec.partition(':')
  options = (m.get('encoding_options') or {}).get(name) or {}
  try:  # bad option values fail here, before any file is written
    encoding = probe_encoding(name, m, max(8, m.get('max_positions') or 0), options)
  except (ValueError, TypeError) as e:
    if not options and m.attention_implementation in ('auto', 'dense'):
      return None  # not the options: the model checks below name the field
    return option_refusal(name, options, e) or f'model.encoding_options.{name}: {e}'
  if m.attention_implementation in ('auto', 'dense'):
    return None
  positions = np.array([0, 2, 5]) if modifier else np.arange(3)
  bias = _score_spec(encoding, m.d_model, m.num_heads, positions)
  # The length is a multiple of every kernel's tile (the TPU rows' 128): the
  # lab's lengths vary per batch, and a kernel that cannot tile one refuses
  # it at that call, naming the length.
  request = Request(t_k=128, t_q=128, causal=True, dtype=jnp.float32,
                    head_dim=m.d_model // m.num_heads, scores=as_terms(bias),
                    normalization=m.get('normalization', 'softmax'))
  try:
    select_implementation(m.attention_implementation, request)
  except ValueError as e:
    return f'model.attention_implementation={m.attention_implementation!r} with {spec!r}: {e}'
  return None


def _check_positive(section, names, prefix):
  for name in names:
    value = section[name]
    _require(isinstance(value, int) and value >= 1,
             f'{prefix}.{name}={value!r} must be an integer >= 1.')


def _check_names(names, allowed, key):
  for name in names:
    _require(name in allowed, f'{key} has {name!r}; allowed: {sorted(allowed)}.')


def _check_normalization(m) -> None:
  norm = m.get('normalization', 'softmax')
  current = m.get('stick_breaking_attend_current', False)
  _check_names((norm,), NORMALIZATIONS, 'model.normalization')
  _require(isinstance(current, bool),
           f'model.stick_breaking_attend_current={current!r} must be True or False.')
  _require(norm == 'stick_breaking' or not current,
           f'model.stick_breaking_attend_current=True needs model.normalization='
           f"'stick_breaking' (it is {norm!r}).")


def _config_check(check, config: ml_collections.ConfigDict) -> None:
  """`check(config)`'s ValueError (its message names the field) as a ConfigError."""
  try:
    check(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def check_fields(config: ml_collections.ConfigDict, *,
                 study: bool = False) -> list[ml_collections.ConfigDict]:
  """Checks the fields of one run's config, or with `study=True` of the
  sweep's (every entry's model included); returns the transformer entries'
  configs it checked (`entry_configs`; none without a transformer)."""
  t, m, tr, ev = config.task, config.model, config.train, config.eval
  _check_positive(t, ('vocab_size', 'train_min_length', 'train_max_length'), 'task')
  _check_positive(m, ('d_model', 'num_heads', 'num_layers', 'mlp_dim', 'rnn_hidden_dim'),
                  'model')
  _check_positive(tr, ('batch_size', 'num_steps', 'log_every', 'steps_per_call'), 'train')
  _check_optimizer(tr)
  for name in ('num_steps', 'log_every', 'checkpoint_every', 'stop_after'):
    _require(tr[name] % tr.steps_per_call == 0,
             f'train.{name}={tr[name]} is not a multiple of train.steps_per_call='
             f'{tr.steps_per_call} (steps run {tr.steps_per_call} per compiled call).')
  _check_positive(ev, ('max_length', 'num_samples', 'batch_size'), 'eval')
  _require(t.train_min_length <= t.train_max_length,
           f'task.train_min_length={t.train_min_length} > task.train_max_length='
           f'{t.train_max_length}: the training length range is empty.')
  _require(t.train_max_length <= ev.max_length,
           f'eval.max_length={ev.max_length} must be >= task.train_max_length='
           f'{t.train_max_length}.')
  for n in ev.lengths:
    _require(isinstance(n, int) and 1 <= n <= ev.max_length,
             f'eval.lengths contains {n!r}; each must be an integer in 1…'
             f'eval.max_length={ev.max_length}.')
  repeated = sorted({n for n in ev.lengths if list(ev.lengths).count(n) > 1})
  # Each length is one row per run in results.csv: a repeat would be two.
  _require(not repeated, f'eval.lengths={tuple(ev.lengths)!r} repeats '
           f'{", ".join(map(str, repeated))}; give each length once.')
  # The batch must divide over the layout's batch axis (every device for
  # 'data' and 'fsdp', devices / model_parallel for 'tensor').
  train_mesh.check(tr, jax.device_count())
  task_names = config.study.tasks if study else (t.name,)
  _check_names(task_names, tasks.TASKS, 'study.tasks' if study else 'task.name')
  kinds = config.study.models if study else (m.kind,)
  _check_names(kinds, MODEL_KINDS, 'study.models' if study else 'model.kind')
  _check_names((m.attention_score,), SCORES, 'model.attention_score')
  if study:
    for name in ('tasks', 'models', 'seeds'):
      _require(len(config.study[name]) >= 1, f'study.{name} is empty; name at least one.')
    seeds = tuple(config.study.seeds)
    _require(all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds),
             f'study.seeds={seeds!r} must be integers >= 0 (a run directory '
             'seedN-K is a retrained sibling, so negative seeds are refused); '
             "three seeds are --config.study.seeds='(0,1,2)', a bare 3 is seed 3 alone.")
    repeated = sorted({x for x in seeds if seeds.count(x) > 1})
    _require(not repeated, f'study.seeds={seeds!r} repeats {", ".join(map(str, repeated))}; '
             'give each seed once (one run directory per seed).')
  _check_names((config.study.get('on_mismatch', 'error'),), ON_MISMATCH, 'study.on_mismatch')
  _check_names((config.study.get('on_locked', 'refuse'),), ON_LOCKED, 'study.on_locked')
  check_shard(config.study.get('shard', ()))
  _require(isinstance(config.study.get('report_only', False), bool),
           f"study.report_only={config.study.get('report_only')!r} must be True or False.")
  _check_positive(config.study, [k for k in ('parallel_setups',) if k in config.study], 'study')
  _config_check(facts.precision, config)  # model.dtype, model.param_dtype
  sharded = [k for k in kinds if k != 'transformer']
  _require(tr.get('mesh', 'data') == 'data' or not sharded,
           f"train.mesh={tr.get('mesh')!r} shards the transformer's named parameter axes; "
           f"model.kind={sharded[0] if sharded else ''!r} has none: use train.mesh='data'.")
  if 'transformer' not in kinds:
    return []  # the remaining checks concern transformers only

  _require(m.d_model % m.num_heads == 0,
           f'model.num_heads={m.num_heads} must divide model.d_model={m.d_model}.')
  entries = config.study.encodings if study else (m.encoding,)
  _require(len(entries) >= 1, 'study.encodings is empty; name at least one, e.g. '
           "--config.study.encodings=\"('rope','alibi')\".")
  k = m.get('abacus_max_k', 0)  # Abacus: the largest training offset
  _require(isinstance(k, int) and not isinstance(k, bool) and k >= 0,
           f'model.abacus_max_k={k!r} must be an integer >= 0.')
  asked = entry_configs(config, study=study)
  parsed = [parse_encoding_spec(c.model.encoding) for c in asked]
  _check_encoding_options(m)
  _check_normalization(m)  # before kernel_refusal, which asks the table about it
  for c in asked:
    refusal = kernel_refusal(c, c.model.encoding) or facts.layer_refusal(c)
    _require(refusal is None, refusal)
  encodings = {name for name, _ in parsed}
  _require(m.num_kv_heads >= 0 and (m.num_kv_heads == 0 or m.num_heads % m.num_kv_heads == 0),
           f'model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads} '
           '(or be 0 = num_heads).')
  _require(m.sliding_window >= 0, f'model.sliding_window={m.sliding_window} must be >= 0 (0 = off).')
  _require(m.get('scalable_softmax', 0) >= 0,
           f'model.scalable_softmax={m.get("scalable_softmax")} must be >= 0 (0 = off, else the '
           'initial s of s·log(n)).')
  _check_names(config.eval.rope_scalings, SCALINGS, 'eval.rope_scalings')
  _require(ev.rope_scale_factor >= 0,
           f'eval.rope_scale_factor={ev.rope_scale_factor} must be > 0 (or 0 = auto).')
  _check_names((config.positions.randomized_eval,), ('random', 'contiguous'),
               'positions.randomized_eval')
  _check_names((config.positions.draw,), ('per_example', 'per_batch'), 'positions.draw')
  if 'rope' in encodings:
    head_dim = m.d_model // m.num_heads
    _require(head_dim % 2 == 0,
             f"'rope' needs an even head_dim; model.d_model // model.num_heads = {head_dim}.")
  return asked


def entry_configs(config: ml_collections.ConfigDict, *,
                  study: bool = False) -> list[ml_collections.ConfigDict]:
  """The config of each transformer entry of the sweep (`study.encodings`,
  `entries.entry_config`), or `[config]` for one run. A ConfigError names
  an entry that is no encoding or variant, or an encoding spec that does
  not parse."""
  m = config.model
  entries = config.study.encodings if study else (m.encoding,)
  own = m.get('variant')
  if study and own and any(e != own for e in entries):
    raise ConfigError(
        f'invalid config: model.variant={own!r} (a variant preset such as '
        f'configs/copy.py:encoding={own}) makes every run of the sweep start from that '
        f'variant, but study.encodings={tuple(entries)!r} has other entries; sweep them from '
        f'the plain preset: --config=configs/copy.py --config.study.encodings=...')
  named = sorted(variants(config))
  out = []
  for entry in entries:
    key = 'study.encodings' if study else 'model.encoding'
    try:
      asked = entry_config(config, entry) if study else config
    except ValueError as e:
      text = str(e)
      if 'is neither an encoding' in text:
        text = text.rstrip('.') + IMPORTS_HINT + '.'
      raise ConfigError(f'invalid config: {key}: {text}') from None
    spec = asked.model.encoding
    try:
      parse_encoding_spec(spec)
    except ValueError as e:
      text = str(e)
      if spec.partition(':')[0] not in ENCODINGS:
        text = text.rstrip('.') + IMPORTS_HINT + '.'
      if named:  # a misspelt variant reads like a misspelt encoding
        text += (f' Named variants ({", ".join(named)}) are study entries, or presets: '
                 f'configs/copy.py:encoding={named[0]}.')
      where = f'{key} entry {entry!r}: ' if study and spec != entry else f'{key}: '
      raise ConfigError(f'invalid config: {where}{text}') from None
    out.append(asked)
  return out
