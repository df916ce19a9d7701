"""The device mesh a run trains on (`train.mesh`), and where its state lives.

Three layouts, over every device (all hosts' with jax.distributed):

* 'data' (the default): a 1-D mesh 'data'; the state replicated on every
  device, each batch split along its first axis (data parallelism). For
  stacked seeds with at least as many seeds as devices, the seed axis is laid
  along the mesh instead (`loop.train_seeds`).
* 'fsdp': a 1-D mesh 'fsdp' under the library's `nn.sharding.FSDP_RULES`:
  the batch and every weight's 'embed' axis split over it, so each device
  holds 1/n of each weight matrix, of its AdamW moments and of the batch.
* 'tensor': a 2-D mesh ('data', 'model'), `train.model_parallel` devices on
  'model' (0: all of them), under `nn.sharding.TENSOR_PARALLEL_RULES`:
  heads, key/value heads, MLP units and the vocabulary split over 'model'
  (Megatron's split), the batch over 'data'.

The layouts compute the same training up to the order of float reductions
(tests/lab/train/test_train_mesh.py: equal to 'data' to float tolerance on 4
emulated devices), so `train.mesh` is not part of a run's identity: a run
may resume on another layout or another device count. The parameters'
logical axis names come from the library (`positional.parameters`); the
rules map them to mesh axes. A size that a mesh axis does not divide (a
weight's axis, the batch) is a ConfigError naming it, raised before
anything compiles.
"""

import contextlib
import difflib
import math
from typing import Optional

import jax
import ml_collections
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attention_jax.lab.errors import ConfigError
from attention_jax.nn import sharding

MESHES = ('data', 'fsdp', 'tensor')
# The rule set of each layout (None: the state replicated, no rules).
RULES = {'data': None, 'fsdp': sharding.FSDP_RULES, 'tensor': sharding.TENSOR_PARALLEL_RULES}


def _auto(n: int) -> dict:
  """Mesh axes of type Auto (XLA propagates shardings from our constraints),
  not the Explicit default of recent JAX, which would make every op's
  sharding part of its type."""
  axis_type = getattr(jax.sharding, 'AxisType', None)
  return {'axis_types': (axis_type.Auto,) * n} if axis_type else {}


def check(train: ml_collections.ConfigDict, devices: int) -> None:
  """ConfigError unless `train.mesh` and `train.model_parallel` name a layout
  of `devices` devices whose batch axis divides `train.batch_size`."""
  name = train.get('mesh', 'data')
  if name not in MESHES:
    close = difflib.get_close_matches(str(name).lower(), MESHES, n=1)
    raise ConfigError(f'invalid config: train.mesh={name!r}; choose one of '
                      f'{", ".join(repr(m) for m in MESHES)}'
                      + (f' (did you mean {close[0]!r}?).' if close else '.'))
  parallel = train.get('model_parallel', 0)
  if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 0:
    raise ConfigError(f'invalid config: train.model_parallel={parallel!r} must be an integer '
                      '>= 0 (0: every device on the model axis).')
  if name != 'tensor' and parallel:
    raise ConfigError(f"invalid config: train.model_parallel={parallel} is for "
                      f"train.mesh='tensor', not {name!r}; leave it 0.")
  if name == 'tensor' and parallel and devices % parallel:
    raise ConfigError(f'invalid config: train.model_parallel={parallel} does not divide the '
                      f'{devices} devices; the mesh is (data, model) = (devices / '
                      'model_parallel, model_parallel).')
  batch_axis = devices // (parallel or devices) if name == 'tensor' else devices
  if train.batch_size % batch_axis:
    raise ConfigError(f'invalid config: train.batch_size={train.batch_size} is not divisible '
                      f'by the {batch_axis} devices of the batch axis of train.mesh={name!r}; '
                      'use a multiple of it.')


def make(name: str = 'data', model_parallel: int = 0) -> jax.sharding.Mesh:
  """The mesh of the layout `name` over every device (module docstring)."""
  devices = jax.device_count()
  if name == 'tensor':
    model = model_parallel or devices
    return jax.make_mesh((devices // model, model), ('data', 'model'), **_auto(2))
  return jax.make_mesh((devices,), (name,), **_auto(1))


def training_mesh(train: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The mesh of `train.mesh` and `train.model_parallel`, checked (`check`)."""
  check(train, jax.device_count())
  return make(train.get('mesh', 'data'), train.get('model_parallel', 0))


def rules_of(train: ml_collections.ConfigDict) -> Optional[tuple]:
  """The logical axis rules of `train.mesh` (None for 'data')."""
  return RULES[train.get('mesh', 'data')]


def batch_axis(mesh: jax.sharding.Mesh) -> str:
  """The mesh axis a batch's first axis is split along."""
  return 'fsdp' if 'fsdp' in mesh.axis_names else 'data'


@contextlib.contextmanager
def active(mesh: jax.sharding.Mesh, rules: Optional[tuple]):
  """The mesh (attention's Pallas kernels run per device on it) and, for
  a sharded layout, its rules, which the modules' activation constraints
  read while the step is traced (`nn.sharding.constrain`)."""
  with jax.set_mesh(mesh), (nnx.logical_axis_rules(rules) if rules else
                            contextlib.nullcontext()):
    yield


def state_specs(state: nnx.State, rules: Optional[tuple]):
  """A PartitionSpec per leaf of a (model, optimizer) `state`: every
  parameter and its AdamW moments as the rules ask by their logical axis
  names, the rest (step counts, keys) replicated; all replicated without
  rules."""
  if rules is None:
    return jax.tree.map(lambda _: P(), state)
  with nnx.logical_axis_rules(rules):
    return nnx.get_partition_spec(state)


def with_seed_axis(specs):
  """`specs` of stacked states: a leading seed axis, kept whole."""
  return jax.tree.map(lambda s: P(None, *s), specs, is_leaf=lambda x: isinstance(x, P))


def check_divides(state: nnx.State, specs, mesh: jax.sharding.Mesh, train_mesh: str) -> None:
  """ConfigError naming the first leaf of `state` with an axis its mesh axis
  does not divide (e.g. 6 heads over a 'model' axis of 4 devices)."""
  flat = dict(nnx.to_flat_state(state))
  flat_specs = dict(nnx.to_flat_state(specs))
  for path, variable in flat.items():
    value = variable.get_value() if hasattr(variable, 'get_value') else variable
    spec = flat_specs[path]
    spec = spec.get_value() if hasattr(spec, 'get_value') else spec
    for size, axes in zip(value.shape, spec):
      if axes is None:
        continue
      count = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
      if size % count:
        name = '.'.join(map(str, path))
        raise ConfigError(
            f'invalid config: train.mesh={train_mesh!r} splits {name} (shape '
            f'{tuple(value.shape)}) over mesh axis {axes!r} of {count} devices, which does not '
            f'divide its size {size}; choose sizes that are multiples of it, or another '
            'train.mesh / train.model_parallel.')


def place(state: nnx.State, mesh: jax.sharding.Mesh, specs) -> nnx.State:
  """`state` laid out on `mesh` as `specs` say."""
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                           is_leaf=lambda x: isinstance(x, P))
  return jax.device_put(state, shardings)
