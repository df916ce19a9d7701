"""How the library makes its parameters: stored in `param_dtype`, annotated
with logical axis names, and how it reads the `dtype` / `param_dtype`
arguments of every module and encoding.

An encoding's `build` takes the registry's other common arguments; its
dtypes come from `make_encoding` through `precision(dtype, param_dtype)`,
the scope `make_encoding` builds it in: `param` stores in the scope's
`param_dtype` and `scope_dtype()` is its `dtype` (float32 and None outside
any scope). A `build`'s signature is the list of an encoding's own options
(the lab reads it so), so the common arguments stay out of it.

Logical axis names are MaxText's: a parameter says what each of its axes is
('embed', 'heads', 'kv', 'mlp', 'vocab', …), and a set of rules
(`nn.sharding`) says which mesh axis each name is split over. The names are
`out_sharding` metadata of the `nnx.Param` (Flax NNX's sharding API:
`nnx.get_partition_spec`, `nnx.logical_axis_rules`), written with
`eager_sharding=False`: Flax would otherwise shard an annotated parameter
when it is made, which needs a mesh, so that single-device use, where there
is none, would fail. The annotations cost nothing until a caller asks for
the specs (docs/api.md has the recipe).
"""

import contextlib
import contextvars
from typing import Optional, Sequence

import jax.numpy as jnp
from flax import nnx

# Parameters' axes (MaxText's names).
EMBED = 'embed'  # the model width d_model
HEADS = 'heads'  # query heads (and per-head parameters)
KV_HEADS = 'kv_heads'  # key/value heads (GQA/MQA)
KV = 'kv'  # head_dim
MLP = 'mlp'  # hidden units of the blocks' MLPs (and of additive attention, GRUs)
VOCAB = 'vocab'  # token ids
NORM = 'norm'  # a norm's scale and bias

PARAMETER_AXES = (EMBED, HEADS, KV_HEADS, KV, MLP, VOCAB, NORM)

# Activations' axes, for `nn.sharding.constrain` (MaxText's names).
ACTIVATION_AXES = ('activation_batch', 'activation_length', 'activation_embed',
                   'activation_heads', 'activation_kv_heads', 'activation_kv',
                   'activation_mlp', 'activation_vocab')

LOGICAL_AXES = PARAMETER_AXES + ACTIVATION_AXES

FLOATING = 'a floating dtype (jnp.float32, jnp.bfloat16, jnp.float16, …)'


def as_dtype(owner: str, name: str, value, *, optional: bool):
  """`value` as a floating `jnp.dtype` (None stays None when `optional`);
  a TypeError for something that is not a dtype, a ValueError for a dtype
  that is not floating, each naming `owner`, the argument and the value."""
  if value is None and optional:
    return None
  allowed = FLOATING + (' or None (from the inputs and parameters, as in Flax)'
                        if optional else '')
  try:
    if value is None:  # jnp.dtype(None) would be float64
      raise TypeError
    dtype = jnp.dtype(value)
  except (TypeError, ValueError):
    raise TypeError(f'{owner}: {name}={value!r} is not a dtype; use {allowed}.') from None
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f'{owner}: {name}={value!r} ({dtype}) is not floating; use {allowed}.')
  return dtype


def check_dtypes(owner: str, dtype, param_dtype):
  """(dtype or None, param_dtype), checked as `as_dtype` does: `dtype` is the
  computation dtype (None: Flax's rule, from the inputs and parameters),
  `param_dtype` the storage of the parameters."""
  return (as_dtype(owner, 'dtype', dtype, optional=True),
          as_dtype(owner, 'param_dtype', param_dtype, optional=False))


_SCOPE = contextvars.ContextVar('precision', default=(None, jnp.dtype(jnp.float32)))


@contextlib.contextmanager
def precision(dtype, param_dtype):
  """The scope in which an encoding is built: `param` stores in `param_dtype`,
  `scope_dtype()` is `dtype` (both checked by the caller, `check_dtypes`)."""
  token = _SCOPE.set((dtype, param_dtype))
  try:
    yield
  finally:
    _SCOPE.reset(token)


def scope_dtype():
  """The computation dtype of the encoding being built (None outside a scope)."""
  return _SCOPE.get()[0]


def scope_param_dtype():
  """The parameter dtype of the encoding being built (float32 outside a scope)."""
  return _SCOPE.get()[1]


def annotation(axes: Sequence[Optional[str]]) -> dict:
  """The metadata that names a parameter's axes (`kernel_metadata=` of Flax's
  layers, or `nnx.Param(value, **annotation(axes))`); see the module docstring."""
  return dict(out_sharding=tuple(axes), eager_sharding=False)


def param(value, axes: Sequence[Optional[str]], param_dtype=None) -> nnx.Param:
  """`nnx.Param` of `value` cast to `param_dtype` (None: the scope's, float32
  outside one), its axes named `axes` (one name, or None, per axis of
  `value`). Initial values are drawn in float32 and cast."""
  value = jnp.asarray(value, scope_param_dtype() if param_dtype is None else param_dtype)
  if len(axes) != value.ndim:
    raise ValueError(f'axes {tuple(axes)} name {len(axes)} axes of a parameter of shape '
                     f'{value.shape}.')
  return nnx.Param(value, **annotation(axes))


def annotate(variable: nnx.Variable, axes: Sequence[Optional[str]]) -> None:
  """Names the axes of a parameter made by a layer that takes no metadata
  (Flax's GRU cells): the same metadata as `annotation`."""
  variable.set_metadata(**annotation(axes))
