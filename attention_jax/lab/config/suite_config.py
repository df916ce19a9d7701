"""DeepMind's suite's config: its checks, before anything runs, and what
makes a workdir's settings comparable (`identity`: a workdir holds one
config's runs; `check_workdir` refuses another, naming the fields).

Each failure is one `ConfigError` naming the field, its value and what is
allowed. The decoder study's counterparts are `validate` and `identity`.
"""

import json
import os

import jax
import ml_collections
from flax import nnx

from attention_jax.lab import tasks
from attention_jax.lab.config.entries import flatten
from attention_jax.lab.config.renamed import RENAMED
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.evaluate import eval_budget
from attention_jax.lab.protocols import encoder_layout
from attention_jax.lab.runs import cluster
from attention_jax.lab.train import suite_programs
from attention_jax.positional import make_encoding
from attention_jax.positional import parse_encoding_spec

# Fields that choose which settings run, or steer a job (checkpoints, stops,
# shards, locks, progress, memory), not what a setting computes.
_NOT_COMPUTED = (('study', 'tasks'), ('study', 'encodings'), ('study', 'learning_rates'),
                 ('study', 'shard'), ('study', 'on_locked'), ('study', 'report_only'),
                 ('study', 'parallel_setups'),
                 ('train', 'log_every'), ('train', 'checkpoint_every'),
                 ('train', 'checkpoint_keep'), ('train', 'stop_after'),
                 ('train', 'max_minutes'), ('train', 'tensorboard'), ('eval', 'cache'))


def _renamed(stored: dict) -> dict:
  """A stored identity with the older fields (`renamed.RENAMED`: the suite
  once named them otherwise, and `kind='chomsky'` its protocol) under today's names."""
  out = json.loads(json.dumps(stored))
  if out.get('kind') == 'chomsky':  # the field that named the encoder protocol's configs
    del out['kind']
    out['protocol'] = 'encoder'
  for (group, key), (new_group, new_key) in RENAMED.items():
    if isinstance(out.get(group), dict) and key in out[group]:
      out.setdefault(new_group, {})[new_key] = out[group].pop(key)
  return out


def identity(config: ml_collections.ConfigDict) -> dict:
  """What every setting of `config` is computed with: the config without
  the fields that only select settings or steer the job."""
  d = config.to_dict()
  for group, key in _NOT_COMPUTED:
    d.get(group, {}).pop(key, None)
  if not d.get('train', {}).get('length_buckets', 1):  # 0 is what older records were
    d['train'].pop('length_buckets')
  return json.loads(json.dumps(d, sort_keys=True, default=list))


def validate(config: ml_collections.ConfigDict) -> None:
  """ConfigError naming the first bad value, before anything runs."""
  t, e, m, study = config.train, config.eval, config.model, config.study
  lengths, p = config.task, config.positions
  longest = max([encoder_layout.padded_slots(tasks.get_spec(n), e.max_length)
                 for n in study.tasks if n in tasks.SPECS], default=0)
  if not study.tasks:
    raise ConfigError(f'invalid config: study.tasks is empty; choose from '
                      f'{list(tasks.SPECS)}.')
  for name in study.tasks:
    if name not in tasks.SPECS:
      raise ConfigError(f'invalid config: unknown task {name!r} in study.tasks; choose from '
                        f'{list(tasks.SPECS)}.')
  if not study.encodings:
    raise ConfigError('invalid config: study.encodings is empty.')
  for field in ('tasks', 'encodings'):
    names = list(study[field])
    if len(set(names)) != len(names):
      twice = sorted({n for n in names if names.count(n) > 1})
      raise ConfigError(f'invalid config: study.{field} names {twice} more than once.')
  m_ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
             for v in (m.d_model, m.num_heads, m.mlp_factor))
  if not m_ok or m.d_model % m.num_heads or m.d_model % 2:
    raise ConfigError(f'invalid config: model.d_model={m.d_model!r} must be an even integer '
                      f'that model.num_heads={m.num_heads!r} divides (model.mlp_factor: an '
                      'integer >= 1).')
  if isinstance(p.max_position, bool) or not isinstance(p.max_position, int) or (
      p.max_position < 1):
    raise ConfigError(f'invalid config: positions.max_position={p.max_position!r} must be an '
                      'integer >= 1 (randomized positions are drawn from [0, it)).')
  if not 0 <= m.dropout < 1:
    raise ConfigError(f'invalid config: model.dropout={m.dropout!r} must be in [0, 1).')
  if not isinstance(e.get('deterministic', True), bool):
    raise ConfigError(f'invalid config: eval.deterministic={e.deterministic!r} must be True '
                      '(no dropout at evaluation) or False (dropout on, as theirs).')
  for spec in study.encodings:
    check_encoding(spec, config)
  if any(suite_programs.noise_kind(spec) for spec in study.encodings) and (
      p.max_position < longest):
    raise ConfigError(f'invalid config: positions.max_position={p.max_position} is below '
                      f'the longest evaluated sequence, {longest} slots: randomized positions '
                      'are distinct draws from [0, positions.max_position).')
  for field, value in (('train.num_steps', t.num_steps),
                       ('train.steps_per_call', t.steps_per_call),
                       ('train.checkpoint_every', t.checkpoint_every),
                       ('train.checkpoint_keep', t.checkpoint_keep),
                       ('train.batch_size', t.batch_size),
                       ('task.train_min_length', lengths.train_min_length),
                       ('eval.num_samples', e.num_samples), ('eval.batch_size', e.batch_size),
                       ('model.num_layers', m.num_layers), ('train.log_every', t.log_every),
                       ('study.parallel_setups', study.get('parallel_setups', 1))):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f'invalid config: {field}={value!r} must be an integer >= 1.')
  for field in ('num_steps', 'checkpoint_every', 'log_every'):
    if t[field] % t.steps_per_call:
      raise ConfigError(f'invalid config: train.{field}={t[field]} must be a multiple of '
                        f'train.steps_per_call={t.steps_per_call} (steps per compiled call).')
  buckets = t.get('length_buckets', 0)
  span = lengths.train_max_length - lengths.train_min_length + 1
  if isinstance(buckets, bool) or not isinstance(buckets, int) or not 0 <= buckets <= span:
    raise ConfigError(f'invalid config: train.length_buckets={buckets!r} must be an integer '
                      f'from 0 (none) to {span}, the training lengths '
                      f'task.train_min_length … task.train_max_length.')
  stop = t.stop_after
  if isinstance(stop, bool) or not isinstance(stop, int) or stop < 0 or stop % t.steps_per_call:
    raise ConfigError(f'invalid config: train.stop_after={stop!r} must be 0 (never) or a '
                      f'multiple of train.steps_per_call={t.steps_per_call}.')
  if isinstance(t.max_minutes, bool) or not (isinstance(t.max_minutes, (int, float))
                                             and 0 <= t.max_minutes < float('inf')):
    raise ConfigError(f'invalid config: train.max_minutes={t.max_minutes!r} must be a finite '
                      'number >= 0 (0: no limit).')
  if e.num_samples % e.batch_size:
    raise ConfigError(f'invalid config: eval.num_samples={e.num_samples} must be a multiple of '
                      f'eval.batch_size={e.batch_size} (their accuracy averages sub-batches).')
  devices = jax.device_count()
  for field, value in (('train.batch_size', t.batch_size), ('eval.batch_size', e.batch_size)):
    if value % devices:  # each batch is split over the devices (`trainer`: data parallel)
      raise ConfigError(f'invalid config: {field}={value} is not divisible by the {devices} '
                        'devices each batch is split over; use a multiple of the device count.')
  if not lengths.train_min_length <= lengths.train_max_length:
    raise ConfigError(f'invalid config: task.train_min_length={lengths.train_min_length} > '
                      f'task.train_max_length={lengths.train_max_length}.')
  if not (1 <= e.min_length and e.max_length >= lengths.train_max_length + 2):
    raise ConfigError(f'invalid config: eval.max_length={e.max_length} must be >= '
                      f'task.train_max_length + 2 = {lengths.train_max_length + 2} (the '
                      'official score starts at the second test length), eval.min_length >= 1.')
  if not study.seeds or len(set(study.seeds)) != len(study.seeds):
    raise ConfigError(f'invalid config: study.seeds={tuple(study.seeds)!r} must be distinct, '
                      'at least one.')
  if not study.learning_rates or any(not lr > 0 for lr in study.learning_rates):
    raise ConfigError(f'invalid config: study.learning_rates={tuple(study.learning_rates)!r} '
                      'must be positive, at least one.')
  if study.on_locked not in ('refuse', 'wait'):
    raise ConfigError(f"invalid config: study.on_locked={study.on_locked!r}; choose 'refuse' "
                      "or 'wait'.")
  cluster.shard_of(config)
  # An evaluation that cannot fit is refused now, not after every model trained.
  eval_budget.check_encoder(config)


def check_encoding(spec: str, config: ml_collections.ConfigDict) -> None:
  """ConfigError unless `spec` names an encoding that runs bidirectionally
  (built once here with causal=False: a causal-only one says why)."""
  try:
    name, _ = parse_encoding_spec(spec)
    suite_programs.noise_kind(spec)
  except ValueError as err:
    raise ConfigError(f'invalid config: study.encodings has {spec!r}: {err}') from None
  if spec.partition(':')[2] not in ('', 'randomized'):
    raise ConfigError(f'invalid config: study.encodings has {spec!r}: the encoder protocol takes '
                      f"NAME or NAME:randomized (coupled positions are defined for the "
                      'decoder layout of the copy family and addition).')
  options = dict((config.model.get('encoding_options') or {}).get(name) or {})
  try:
    make_encoding(name, d_model=config.model.d_model, num_heads=config.model.num_heads,
                  max_positions=config.positions.max_position, causal=False,
                  rngs=nnx.Rngs(0), **options)
  except ValueError as err:
    raise ConfigError(f'invalid config: encoding {spec!r} cannot run the bidirectional '
                      f'encoder protocol: {err}') from None


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """ConfigError if `workdir` holds runs of another config (names the fields)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return
  try:
    with open(path) as f:
      stored = json.load(f)['identity']
    if not isinstance(stored, dict):
      raise ValueError(f'its identity is a {type(stored).__name__}, not a mapping')
  except (OSError, ValueError, KeyError, TypeError) as err:
    raise ConfigError(f'{path} is damaged ({err}); move it away or use another '
                      '--workdir.') from None
  mine, stored = identity(config), _renamed(stored)
  if stored != mine:
    old, new = flatten(stored), flatten(mine)
    fields = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    raise ConfigError(f'--workdir={workdir} holds runs of another config (differing: '
                      f'{", ".join(fields)}); use a new --workdir for this one.')
