"""What a run's config implies, one fact per function: the task with its
data options, the evaluation tasks, the position ranges, the model's
constructor options.

`resolved.resolve` asks each once and keeps the answers in the run's
record, which every later stage reads. Only what runs before a record
exists asks them directly: the field checks, the evaluation budget (at
each candidate `eval.max_length`), and a config's completed encoding
options (`resolve_options`) for its hash and workdir identity.
"""

import dataclasses
import inspect
import re

import jax.numpy as jnp
import ml_collections

from attention_jax.attention.normalization import Normalization
from attention_jax.attention.normalization import StickBreaking
from attention_jax.lab import tasks
from attention_jax.nn.layer_pattern import layer_specs
from attention_jax.positional import ENCODINGS
from attention_jax.positional import parse_encoding_spec
from attention_jax.positional.base import ATTENTION_HOOKS
from attention_jax.positional.base import hooks_of

MODEL_KINDS = ('transformer', 'seq2seq', 'seq2seq_attention')
# model.dtype / model.param_dtype. float16 is refused: without loss scaling its
# 5-bit exponent underflows small gradients; bfloat16 keeps float32's range.
DTYPES = ('float32', 'bfloat16')


def encoding_name(config: ml_collections.ConfigDict) -> str:
  """The registry name in `config.model.encoding` ('NAME' or 'NAME:randomized')."""
  return parse_encoding_spec(config.model.encoding)[0]


def is_randomized(config: ml_collections.ConfigDict) -> bool:
  """Whether the run trains on randomized positions ('NAME:randomized')."""
  return (config.model.kind == 'transformer'
          and parse_encoding_spec(config.model.encoding)[1])


def is_coupled(config: ml_collections.ConfigDict) -> bool:
  """Whether the run trains on coupled positions ('NAME:coupled'; Cho et al.
  2024, `tasks/coupling.py`)."""
  return (config.model.kind == 'transformer'
          and config.model.encoding.partition(':')[2] == 'coupled')


def coupled_max_position(config: ml_collections.ConfigDict) -> int:
  """Coupled position ids lie in [0, this); 0 when not coupled. Default
  (`positions.max_position` 0): eval.max_length + 3, the ids of the longest
  evaluated input at offset 1, every one of them trained by random offsets."""
  if not is_coupled(config):
    return 0
  return config.positions.max_position or config.eval.max_length + 3


def pack_segments(config: ml_collections.ConfigDict) -> int:
  """`task.pack_segments` (absent in older configs: 0, off): training rows of
  that many padded examples' tokens, filled with examples that each attend
  only to themselves (`tasks/packed_rows.py`). A ValueError names a bad
  value or a combination that cannot work."""
  k = config.task.get('pack_segments', 0)
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    raise ValueError(f'invalid config: task.pack_segments={k!r} must be an integer >= 0 '
                     '(0 = off; K = training rows of K padded examples\' tokens).')
  if k and config.task.get('pack', 1) > 1:
    raise ValueError(f"invalid config: task.pack_segments={k} and task.pack="
                     f"{config.task.pack} do not combine: task.pack's examples see each other "
                     'on purpose, pack_segments\' see only themselves; set one of them off '
                     '(task.pack=1 or task.pack_segments=0).')
  if k and uses_abacus(config):
    raise ValueError(f'invalid config: task.pack_segments={k} with Abacus embeddings '
                     '(model.abacus): their digit runs would continue from one example into '
                     'the next; set task.pack_segments=0.')
  return k


def configured_task(config: ml_collections.ConfigDict) -> tasks.DecoderTask:
  """`config.task.name`'s task with the config's data options: `task.pack`
  examples per training sequence or `task.pack_segments` (transformers; off
  for seq2seq models, which train one example per sequence) and coupled
  positions ('NAME:coupled'). A ValueError names a bad value."""
  task = task_of(config)
  pack = config.task.get('pack', 1)
  if isinstance(pack, bool) or not isinstance(pack, int) or pack < 1:
    raise ValueError(f'invalid config: task.pack={pack!r} must be an integer >= 1 '
                     '(examples per training sequence).')
  segments = pack_segments(config)
  max_position = coupled_max_position(config)
  if max_position:
    task.check_max_position(max_position, config.eval.max_length)
  transformer = config.model.kind == 'transformer'
  return dataclasses.replace(task, pack=pack if transformer else 1,
                             pack_segments=segments if transformer else 0,
                             coupled_max_position=max_position,
                             abacus_max_k=abacus_max_k(config))


def training_task(config: ml_collections.ConfigDict) -> tasks.DecoderTask:
  """`configured_task` as training draws it: with the options that change
  only the training distribution (`Task.for_training`: addition's
  `task.carry_mix`). A ValueError names a bad value."""
  return configured_task(config).for_training(config.task)


def evaluation_tasks(config: ml_collections.ConfigDict) -> list:
  """The tasks a trained model is scored on: `configured_task`, then each
  of `eval.tasks` not already it (tasks of the same tokens, e.g.
  flip-flop's sparse and dense distributions beside its training one),
  configured from the same `task` group, with the same data options; each
  scores its rows under its own name. A ValueError names one that is
  unknown or whose tokens differ from the model's."""
  first = configured_task(config)
  out = [first]
  for name in tuple(config.eval.get('tasks', ()) or ()):
    if name in [t.name for t in out]:
      continue
    try:
      other = tasks.get_task(name).configure(config.task)
    except ValueError as e:  # the message names the evaluation task, not the trained one
      raise ValueError(f'eval.tasks has {name!r}: {e}') from None
    vocab = config.task.vocab_size
    if (other.num_symbols(vocab) != first.num_symbols(vocab)
        or other.sequence_length(config.eval.max_length)
        != first.sequence_length(config.eval.max_length)):
      raise ValueError(f'eval.tasks has {name!r}, whose tokens or sequence lengths differ '
                       f'from those of task {first.name!r} the model is trained on; list '
                       'tasks of the same layout (e.g. flipflop_sparse, flipflop_dense for '
                       'flipflop).')
    out.append(dataclasses.replace(other, pack=first.pack,
                                   coupled_max_position=first.coupled_max_position,
                                   abacus_max_k=first.abacus_max_k))
  return out


def uses_abacus(config: ml_collections.ConfigDict) -> bool:
  """Whether the model adds Abacus embeddings (McLeish et al. 2024; `model.abacus`)."""
  return config.model.kind == 'transformer' and bool(config.model.get('abacus', False))


def abacus_max_k(config: ml_collections.ConfigDict) -> int:
  """The largest training offset k of Abacus ids; 0 without Abacus."""
  return config.model.get('abacus_max_k', 0) if uses_abacus(config) else 0


def abacus_embeddings(config: ml_collections.ConfigDict) -> int:
  """Rows of the Abacus table: `model.abacus_embeddings`, or 0 = enough
  (`abacus_rows_needed`)."""
  if config.model.get('abacus_embeddings', 0):
    return config.model.abacus_embeddings
  return abacus_rows_needed(task_of(config), config.eval.max_length,
                            config.task.train_max_length, abacus_max_k(config))


def abacus_rows_needed(task, eval_max_length: int, train_max_length: int, max_k: int) -> int:
  """Abacus rows enough for the longest number evaluated (ids 1 … n) and for
  every training offset (ids up to the longest trained number + `max_k`),
  plus id 0."""
  return 1 + max(task.max_number_length(eval_max_length),
                 task.max_number_length(train_max_length) + max_k)


def task_of(config: ml_collections.ConfigDict):
  """`config.task.name`'s task with the options of the config's `task`
  group (`Task.configure`: e.g. addition's index hints), not yet packing or
  coupling (`configured_task`). A ValueError names a bad name or value."""
  return tasks.get_task(config.task.name).configure(config.task)


def longest_sequence(config: ml_collections.ConfigDict) -> int:
  """Tokens the model reads at the longest evaluated input."""
  return tasks.tokens_read(task_of(config), config.eval.max_length)


def randomized_max_position(config: ml_collections.ConfigDict) -> int:
  """Randomized positions are drawn from [0, this); 0 when not randomized."""
  if not is_randomized(config):
    return 0
  return config.positions.max_position or 2 * longest_sequence(config)


def model_max_positions(config: ml_collections.ConfigDict) -> int:
  """Positions the model must cover: the longest evaluation sequence (or the
  randomized range), unless `config.model.max_positions` says otherwise
  (validated elsewhere)."""
  if config.model.max_positions:
    return config.model.max_positions
  return max(longest_sequence(config), randomized_max_position(config),
             coupled_max_position(config))


def encoding_options(config: ml_collections.ConfigDict) -> dict:
  """The keyword options encoding NAME is built with: its `build` defaults
  (`option_defaults`), replaced by `config.model.encoding_options.NAME`'s."""
  name = encoding_name(config)
  return {**option_defaults(name), **dict(config.model.encoding_options.get(name) or {})}


# A `build` argument every encoding takes (`make_encoding`), not an option.
_COMMON = frozenset({'d_model', 'num_heads', 'max_positions', 'causal', 'rngs'})
# The lab's own choice for an option (reason beside it), over the default.
_LAB_DEFAULTS = {
    # A host callback the lab does not need: validation proves the table
    # covers every position trained and evaluated (`run_checks`).
    'learned': {'check_positions': False},
}


def option_defaults(name: str) -> dict:
  """The keyword options of encoding `name`'s `build`, with their defaults
  (the lab's, `_LAB_DEFAULTS`, where it has one)."""
  parameters = inspect.signature(ENCODINGS[name].build).parameters.values()
  found = {p.name: p.default for p in parameters
           if p.name not in _COMMON and p.default is not inspect.Parameter.empty}
  return {**found, **_LAB_DEFAULTS.get(name, {})}


def resolve_options(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with its encoding's options complete: every option of the
  encoding's `build` that `model.encoding_options.NAME` does not set takes
  its default, so the run's record (config.json, hash) says what was built.
  Other encodings' groups are left as they are; so is a config of another
  model kind or an unknown encoding (validation names it)."""
  if config.model.kind != 'transformer':
    return config
  try:
    name = encoding_name(config)
  except ValueError:
    return config
  resolved = ml_collections.ConfigDict(config.to_dict())
  if resolved.model.get('encoding_options') is None:
    resolved.model.encoding_options = ml_collections.ConfigDict()
  groups = resolved.model.encoding_options
  listed = groups[name].to_dict() if groups.get(name) else {}
  groups[name] = ml_collections.ConfigDict({**option_defaults(name), **listed})
  return resolved


def precision(config: ml_collections.ConfigDict) -> dict:
  """`dtype` (computation) and `param_dtype` (storage) for the library's
  modules, from model.dtype and model.param_dtype (absent in older configs:
  float32). Softmax, RoPE angles, gates and the logits stay float32 whatever
  they say (the library's rule), so the loss is float32. A ValueError names
  a value outside `DTYPES`."""
  found = {}
  for name in ('dtype', 'param_dtype'):
    value = config.model.get(name, 'float32')
    if value not in DTYPES:
      raise ValueError(f'invalid config: model.{name}={value!r}; allowed: {list(DTYPES)} '
                       '(float16 is refused: without loss scaling it underflows gradients).')
    found[name] = jnp.dtype(value)
  return found


def normalization(config: ml_collections.ConfigDict) -> Normalization:
  """'softmax', or a `StickBreaking` with model.stick_breaking_attend_current,
  from model.normalization (absent in older configs: softmax)."""
  m = config.model
  if m.get('normalization', 'softmax') != 'stick_breaking':
    return m.get('normalization', 'softmax')
  return StickBreaking(attend_current=m.get('stick_breaking_attend_current', False))


def encoding_layers(config: ml_collections.ConfigDict):
  """`model.encoding_layers` as `TransformerLM` takes it: None (absent or
  None: every layer), a pattern string ('rope/64,none', `nn.layer_pattern`)
  or a tuple of layer indices, also as the command line gives them (the
  field holds a string: '(0,)', '0,2')."""
  layers = config.model.get('encoding_layers')
  if isinstance(layers, str) and re.fullmatch(r'\s*\(?\s*\d+(\s*,\s*\d+)*\s*,?\s*\)?\s*', layers):
    return tuple(int(i) for i in re.findall(r'\d+', layers))
  return layers if layers is None or isinstance(layers, str) else tuple(layers)


def layer_refusal(config: ml_collections.ConfigDict):
  """A line naming a bad `model.encoding_layers` for this config's model
  (`nn.layer_pattern`), or None: checked before anything trains."""
  if config.model.kind != 'transformer':
    return None
  name = encoding_name(config)
  try:
    layer_specs(encoding_layers(config), num_layers=config.model.num_layers, encoding=name,
                in_attention=bool(hooks_of(ENCODINGS[name]) & ATTENTION_HOOKS),
                sliding_window=config.model.sliding_window or None)
  except (TypeError, ValueError) as e:
    return f'model.{e}'
  return None
