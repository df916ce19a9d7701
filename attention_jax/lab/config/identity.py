"""Which config a run directory belongs to.

A run directory holds one trained model. Its `config.json` records the config
the model was trained with (written before the first step); its `run.json`
records the evaluation config that produced its `results.csv`. Before
anything trains, a config is compared with what a directory holds:

* every field that changes the trained model must be equal, or the run is
  refused with one message naming the fields and both values;
  `study.on_mismatch='retrain'` trains into a fresh sibling directory
  (`seed0-2`, `seed0-3`, …) instead, so two configs never share a directory;
* evaluation fields may differ: the stored model is evaluated again.

"Changes the trained model" is everything except `NOT_TRAINING`, a list of
evaluation, logging and execution fields: a field added to a config counts
as part of the trained model until it is listed here. Two things derive from
evaluation fields and are compared as such: the parameter shapes (a learned
table is sized from eval.max_length when model.max_positions is 0) and, for
encodings drawing positions from a range (NAME:modifier) with
positions.max_position 0, eval.max_length itself (the range derives from it).
"""

import functools
import glob
import json
import os
import re
import time
from typing import Optional

import jax
import ml_collections
from flax import nnx

from attention_jax.lab.config import facts
from attention_jax.lab.config.entries import flatten
from attention_jax.lab.report import result_files
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.config import resolved as run_record

# Fields that do not change the trained model (a trailing '.' covers a group).
NOT_TRAINING = (
    'eval.',  # what is measured (see the module docstring for what derives from it)
    'positions.randomized_eval',  # evaluation positions
    'study.',  # which runs a sweep visits; a run's config has its own task/kind/encoding/seed
    'train.stop_after', 'train.max_minutes', 'train.log_every', 'train.checkpoint_every',
    'train.checkpoint_keep', 'train.tensorboard',  # when to stop, log and checkpoint
    'train.steps_per_call',  # steps fused per compiled call: the same training (to 1e-6)
    'train.mesh', 'train.model_parallel',  # where the state lives: the same training (to 1e-5)
    'progress', 'distributed', 'deterministic_gpu', 'imports',  # how the process runs
    'protocol',  # which benchmark runs the config: a run directory is the decoder's alone
)
# Fields whose change re-evaluates a stored model.
EVALUATION = ('eval.', 'positions.randomized_eval')
# What places a run in a sweep (and in `TASK/LABEL/seedN`).
RUN_KEYS = ('task.name', 'model.kind', 'model.encoding', 'train.seed')
HINT = ('use a new --workdir, or --config.study.on_mismatch=retrain to train into a '
        'fresh run directory.')
_MISSING = '(absent)'
# The run directory's record of its extensions (see the module docstring).
EXTENSIONS = 'extensions.json'
# Fields added to the config after runs were made with older code: a stored
# config without one was trained as its value here says (what the older code
# did), so an upgrade does not turn finished runs into mismatches.
ADDED_LATER = {'model.normalization': 'softmax', 'model.stick_breaking_attend_current': False,
               'model.scalable_softmax': 0.0, 'model.encoding_options.hard_alibi.offsets': (),
               'model.variant': '', 'model.dtype': 'float32', 'model.param_dtype': 'float32',
               'task.pack_segments': 0, 'model.encoding_layers': None, 'task.carry_mix': 0.0}


class RunMismatch(ConfigError):
  """A run directory holds a model trained with another config. `problem`:
  what differs; the message adds what to do."""

  def __init__(self, problem: str, hint: str = HINT):
    super().__init__(f'{problem}; {hint}')
    self.problem = problem


def _normalized(value):
  """JSON's view of a value (tuples become lists), so a config read back from
  config.json compares equal to the one it was written from."""
  return json.loads(json.dumps(value, sort_keys=True, default=str))


def _listed(key: str, patterns) -> bool:
  return any(key == p or (p.endswith('.') and key.startswith(p)) for p in patterns)


@functools.lru_cache(maxsize=64)
def _shapes(config_json: str) -> tuple:
  """(path, shape) of every variable of the model `config_json` builds,
  without allocating it."""
  config = ml_collections.ConfigDict(json.loads(config_json))
  build = lambda: run_record.build_model_only(config, 0)
  state = nnx.to_pure_dict(nnx.state(nnx.eval_shape(build)))
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return tuple(('/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path),
                list(leaf.shape)) for path, leaf in leaves)


def trained_fields(config: ml_collections.ConfigDict) -> dict:
  """The fields that make a run's trained model, flat ('train.learning_rate'),
  JSON-normalized; see the module docstring."""
  flat = flatten(config.to_dict())
  spec = str(flat.get('model.encoding', ''))
  name, _, modifier = spec.partition(':')
  modifier = modifier if flat.get('model.kind') == 'transformer' else ''
  fields = {k: v for k, v in flat.items() if not _listed(k, NOT_TRAINING)
            # Options of other encodings do not reach this run's model, nor
            # the positions group a run without NAME:modifier.
            and not (k.startswith('model.encoding_options.') and k.split('.')[2] != name)
            and not (k.startswith('positions.') and not modifier)}
  if modifier and not flat.get('positions.max_position'):
    fields['eval.max_length'] = flat.get('eval.max_length')
  if fields.get('model.encoding_layers') is not None:
    # As the model reads it: layer indices from a file (0, 2) and from the
    # command line ('(0, 2)', '0,2') are one config.
    fields['model.encoding_layers'] = facts.encoding_layers(config)
  try:
    # The seed and the sweep do not shape the model: one build per setup.
    key = dict(config.to_dict(), study=None, train=dict(config.train.to_dict(), seed=0))
    for path, shape in _shapes(json.dumps(key, sort_keys=True, default=str)):
      fields[f'shape of {path}'] = shape
  except Exception:  # pylint: disable=broad-except
    pass  # a config this version cannot build (an older layout): its fields still differ
  return _normalized(fields)


# Evaluation fields added later, at the value older code had: left out of
# the record while at it, so existing runs are not evaluated again.
EVALUATION_ADDED_LATER = {'eval.one_bucket': False}


def evaluation_fields(config: ml_collections.ConfigDict) -> dict:
  """The fields that make a run's results given its model."""
  return _normalized({k: v for k, v in flatten(config.to_dict()).items()
                      if _listed(k, EVALUATION)
                      and not (k in EVALUATION_ADDED_LATER and v == EVALUATION_ADDED_LATER[k])})


def read_config(run_dir: str) -> Optional[ml_collections.ConfigDict]:
  """The config `run_dir` was trained with (its config.json), or None."""
  try:
    with open(os.path.join(run_dir, 'config.json')) as f:
      return ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError):
    return None


def checkpoint_steps(run_dir: Optional[str]) -> list[int]:
  """Steps of `run_dir`'s checkpoints by folder name, in order (the restore
  itself decides what is readable)."""
  checkpoints = os.path.join(run_dir, 'checkpoints') if run_dir else ''
  if not os.path.isdir(checkpoints):
    return []
  return sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())


def has_trained_state(run_dir: str) -> bool:
  """Whether anything trained is in `run_dir`: a checkpoint or results."""
  return os.path.exists(os.path.join(run_dir, 'results.csv')) or bool(checkpoint_steps(run_dir))


def _describe(diffs: list, run_dir: str) -> str:
  shown = diffs[:6]
  more = f' (and {len(diffs) - len(shown)} more fields)' if len(diffs) > len(shown) else ''
  fmt = lambda v: _MISSING if v is _MISSING else repr(v)
  if len(shown) == 1:
    key, old, new = shown[0]
    text = f'{run_dir} was trained with {key}={fmt(old)}, this config has {fmt(new)}'
  else:
    text = (f'{run_dir} was trained with ' + ', '.join(f'{k}={fmt(o)}' for k, o, _ in shown)
            + '; this config has ' + ', '.join(f'{k}={fmt(n)}' for k, _, n in shown))
  if any(k.startswith('shape of ') for k, _, _ in shown):
    text += ' (with model.max_positions=0, tables are sized from eval.max_length)'
  return text + more


def differences(stored: ml_collections.ConfigDict, config: ml_collections.ConfigDict
                ) -> list[tuple[str, object, object]]:
  """(field, stored value, value in `config`) for each trained-model field
  that differs."""
  # Options a config leaves to the encoding's defaults count as those values
  # (an older config.json lists fewer).
  old, new = (trained_fields(facts.resolve_options(c)) for c in (stored, config))
  for key, value in ADDED_LATER.items():
    old.setdefault(key, value)
    new.setdefault(key, value)
  return [(k, old.get(k, _MISSING), new.get(k, _MISSING)) for k in sorted(old.keys() | new.keys())
          if old.get(k, _MISSING) != new.get(k, _MISSING)]


def _num_steps_change(diffs: list) -> Optional[tuple[int, int]]:
  """(stored, new) `train.num_steps` when that is the only difference."""
  if len(diffs) != 1 or diffs[0][0] != 'train.num_steps':
    return None
  _, old, new = diffs[0]
  return (old, new) if isinstance(old, int) and isinstance(new, int) else None


def _compare(run_dir: str, config: ml_collections.ConfigDict
             ) -> tuple[Optional[str], Optional[dict]]:
  """(what differs or None, the extension or None): see `mismatch` and
  `extension`."""
  if not has_trained_state(run_dir):
    return None, None
  stored = read_config(run_dir)
  if stored is None:
    return f'{run_dir} holds a trained model but no readable config.json to compare with', None
  diffs = differences(stored, config)
  steps = _num_steps_change(diffs)
  if steps and steps[1] > steps[0]:
    return None, dict(from_step=max(checkpoint_steps(run_dir), default=0),
                      previous_num_steps=steps[0], num_steps=steps[1])
  if steps:
    return (f'{run_dir} was trained toward train.num_steps={steps[0]}, this config has '
            f'{steps[1]}: a run cannot be shortened (its learning rate decays toward step '
            f'{steps[0]}); raise train.num_steps to train it longer', None)
  return (_describe(diffs, run_dir) if diffs else None), None


def mismatch(run_dir: str, config: ml_collections.ConfigDict) -> Optional[str]:
  """None if `run_dir` may hold `config`'s run (nothing trained in it yet,
  trained with the same trained-model fields, or an `extension`); else what
  differs."""
  return _compare(run_dir, config)[0]


def extension(run_dir: str, config: ml_collections.ConfigDict) -> Optional[dict]:
  """What training `config` in `run_dir` extends, when `run_dir`'s model
  differs from `config`'s by a larger `train.num_steps` only: `from_step`
  (its newest checkpoint), `previous_num_steps` (the count its schedule was
  made for), `num_steps` (the new count); else None."""
  return _compare(run_dir, config)[1]


def extensions(run_dir: str) -> list[dict]:
  """The extensions recorded in `run_dir`, oldest first ([] if none)."""
  try:
    with open(os.path.join(run_dir, EXTENSIONS)) as f:
      return json.load(f)
  except OSError:
    return []


def describe_extension(run_dir: str, grown: dict) -> str:
  """The line printed when a run is extended."""
  return (f"{run_dir}: trained to step {grown['from_step']} of {grown['previous_num_steps']}; "
          f"continuing to {grown['num_steps']} (the schedule of "
          f"train.num_steps={grown['num_steps']} from step {grown['from_step']}, not a run of "
          f"{grown['num_steps']} steps from the start; recorded in "
          f"{os.path.join(run_dir, EXTENSIONS)})")


def claim(run_dir: str, config: ml_collections.ConfigDict) -> Optional[dict]:
  """Refuses (`RunMismatch`) a directory trained with another config, else
  records `config` as the one its model is trained with; returns the
  `extension` this is (recorded in EXTENSIONS first: a stop in between
  leaves the old config.json, and the next claim the same one record), or
  None."""
  problem, grown = _compare(run_dir, config)
  if problem:
    raise RunMismatch(problem)
  if jax.process_index() == 0:
    os.makedirs(run_dir, exist_ok=True)
    if grown:
      done = extensions(run_dir)
      if not done or {k: done[-1].get(k) for k in grown} != grown:
        result_files.write_text(os.path.join(run_dir, EXTENSIONS), json.dumps(
            done + [dict(grown, date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))],
            indent=1))
    result_files.write_text(os.path.join(run_dir, 'config.json'),
                       config.to_json_best_effort(indent=1, sort_keys=True))
  return grown


def siblings(run_dir: str) -> list[str]:
  """Existing `run_dir-2`, `run_dir-3`, … in order."""
  pattern = re.compile(re.escape(os.path.basename(run_dir)) + r'-(\d+)$')
  found = [(int(m.group(1)), p) for p in glob.glob(glob.escape(run_dir) + '-*')
           if (m := pattern.match(os.path.basename(p)))]
  return [p for _, p in sorted(found)]


def find_trained(run_dir: str, config: ml_collections.ConfigDict) -> Optional[str]:
  """`run_dir` or the sibling `run_dir-N` that holds a model trained with
  `config`, else the first that `config` extends (`extension`), or None."""
  trained = [d for d in [run_dir] + siblings(run_dir) if has_trained_state(d)]
  compared = [(d, _compare(d, config)) for d in trained]
  exact = [d for d, (problem, grown) in compared if problem is None and grown is None]
  return (exact or [d for d, (problem, _) in compared if problem is None] or [None])[0]


def resolve(run_dir: str, config: ml_collections.ConfigDict) -> str:
  """The directory `config`'s run lives in: the one of `run_dir` and its
  siblings `run_dir-N` that holds this config's model, else `run_dir` if
  nothing is trained in it; else, with `study.on_mismatch='retrain'`, the
  next free sibling; else `RunMismatch`."""
  found = find_trained(run_dir, config)
  if found:
    return found
  problem = mismatch(run_dir, config)
  if problem is None:
    return run_dir
  if on_mismatch(config) == 'retrain':
    existing = siblings(run_dir)
    free = [d for d in existing if not has_trained_state(d)]
    last = max((int(d.rsplit('-', 1)[1]) for d in existing), default=1)
    return free[0] if free else f'{run_dir}-{last + 1}'
  raise RunMismatch(problem)


def resolve_all(runs: list[tuple[str, ml_collections.ConfigDict]]) -> list[str]:
  """`resolve` for every (run_dir, config) of a sweep, before any trains;
  every mismatch is in one `RunMismatch` (the first named, the rest counted)."""
  resolved, problems = [], []
  for run_dir, config in runs:
    try:
      resolved.append(resolve(run_dir, config))
    except RunMismatch as e:
      problems.append(e.problem)
  if problems:
    more = f' ({len(problems) - 1} more runs differ as well)' if len(problems) > 1 else ''
    raise RunMismatch(problems[0] + more)
  return resolved


def on_mismatch(config: ml_collections.ConfigDict) -> str:
  study = config.get('study') or {}
  return study.get('on_mismatch', 'error')


def evaluated_rows(run_dir: str, config: ml_collections.ConfigDict) -> Optional[list[dict]]:
  """The run's result rows if it was evaluated with `config`'s evaluation
  fields and trained to its `train.num_steps` (results.csv, and run.json
  recording both); None if it must be evaluated (again). The step count is
  the one trained-model field that changes in a run directory (an
  `extension`): the others are equal or the run is refused before this."""
  try:
    with open(os.path.join(run_dir, 'run.json')) as f:
      info = json.load(f)
  except (OSError, ValueError):
    return None
  path = os.path.join(run_dir, 'results.csv')
  trained_to = ((info.get('config') or {}).get('train') or {}).get('num_steps')
  if (info.get('evaluation') != evaluation_fields(config) or not os.path.exists(path)
      or trained_to != config.train.num_steps):
    return None
  if config.eval.get('grid') and not os.path.exists(os.path.join(run_dir, 'grid.csv')):
    return None  # evaluated before its grid was asked for (or the file was lost)
  return result_files.read_rows(path)
