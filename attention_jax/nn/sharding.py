"""Sharding over a device mesh: logical axis rules, and activation constraints.

Every parameter of the library names its axes with MaxText's logical names
(`positional.parameters`: 'embed', 'heads', 'kv_heads', 'kv', 'mlp',
'vocab', 'norm'); a rule set maps each name to a mesh axis or to None
(replicated). Flax NNX reads the rules from `nnx.logical_axis_rules(rules)`
in `nnx.get_partition_spec(state)`; docs/api.md has the whole recipe (a mesh
from `jax.make_mesh`, sharded init, a sharded train step).

Two rule sets for the two usual layouts:

* `FSDP_RULES`, on a mesh axis 'fsdp': the batch and every parameter's
  'embed' axis are split over it (each device holds 1/n of each weight
  matrix and of the batch; XLA gathers a layer's weights where it is used).
* `TENSOR_PARALLEL_RULES`, on mesh axes ('data', 'model'): the batch over
  'data'; heads, key/value heads, MLP units and the vocabulary over 'model'
  (Megatron's split: W_Q/W_K/W_V and mlp_in by columns, W_O and mlp_out by
  rows, so one reduction per block).

`logical_rules(**assignments)` builds another set; a name it does not
assign is replicated (Flax would otherwise keep an unknown name as a mesh
axis name, which no mesh has).

`constrain(x, axes)` is `jax.lax.with_sharding_constraint` of an activation
by its logical axes, applied only under a mesh of more than one device
(`jax.set_mesh`) with logical rules set; otherwise it returns `x` itself,
so single-device use is unchanged and costs nothing.
"""

from typing import Optional, Sequence

import jax
from flax.core import spmd as core_spmd
from jax.sharding import PartitionSpec

from attention_jax.attention.partition import context_mesh
from attention_jax.positional.parameters import LOGICAL_AXES

# Activations' logical axes, as `constrain` takes them.
BATCH_LENGTH_EMBED = ('activation_batch', 'activation_length', 'activation_embed')
BATCH_LENGTH_MLP = ('activation_batch', 'activation_length', 'activation_mlp')
BATCH_LENGTH_VOCAB = ('activation_batch', 'activation_length', 'activation_vocab')
QUERY_HEADS = ('activation_batch', 'activation_length', 'activation_heads', 'activation_kv')
KV_HEADS = ('activation_batch', 'activation_length', 'activation_kv_heads', 'activation_kv')


def logical_rules(**assignments: Optional[str]) -> tuple:
  """A full rule set `((logical name, mesh axis or None), ...)` for
  `nnx.logical_axis_rules`: every logical name of the library, those not in
  `assignments` replicated (None). A name that is not one of the library's
  is a ValueError naming it and the allowed names."""
  unknown = sorted(set(assignments) - set(LOGICAL_AXES))
  if unknown:
    raise ValueError(f'logical_rules: unknown logical axis names {unknown}; the library\'s '
                     f'are {list(LOGICAL_AXES)}.')
  return tuple((name, assignments.get(name)) for name in LOGICAL_AXES)


FSDP_RULES = logical_rules(activation_batch='fsdp', embed='fsdp')

TENSOR_PARALLEL_RULES = logical_rules(
    activation_batch='data', heads='model', kv_heads='model', mlp='model', vocab='model',
    activation_heads='model', activation_kv_heads='model', activation_mlp='model',
    activation_vocab='model')


def _active_rules() -> dict:
  return dict(core_spmd.get_logical_axis_rules())


def constrain(x: jax.Array, axes: Sequence[Optional[str]]) -> jax.Array:
  """x with its axes (one logical name, or None, per axis of x) sharded as
  the active rules say, under a mesh of more than one device; else x itself
  (module docstring). A logical name the rules do not give is replicated."""
  rules = _active_rules()
  if not rules or context_mesh() is None:
    return x
  if len(axes) != x.ndim:
    raise ValueError(f'constrain: axes {tuple(axes)} name {len(axes)} axes of an array of '
                     f'shape {x.shape}.')
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*(rules.get(a) for a in axes)))

