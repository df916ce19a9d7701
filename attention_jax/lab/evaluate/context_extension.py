"""RoPE context extension at evaluation time: PI, NTK-aware, YaRN.

A trained RoPE model is evaluated with scaled frequencies (see
`positional/rope.py`) without retraining. The scaling is a static attribute
of the model's `RoPE` module(s), set for the duration of a `with` block:
the evaluation then compiles its own program, and the model is restored after.
"""

import contextlib
from typing import Iterator, Optional, Union

import ml_collections
from flax import nnx

from attention_jax.lab.config import entries
from attention_jax.lab.config.resolved import ResolvedRun
from attention_jax.lab.config.resolved import resolve
from attention_jax.lab import tasks
from attention_jax.positional.rope import RoPE
from attention_jax.positional.rope import RopeScaling


def rope_modules(model: nnx.Module) -> list[RoPE]:
  """Every distinct `RoPE` module inside `model`."""
  found = {}
  for _, node in nnx.iter_graph(model):
    if isinstance(node, RoPE):
      found[id(node)] = node
  return list(found.values())


@contextlib.contextmanager
def rope_scaled(model: nnx.Module, scaling: Optional[RopeScaling]) -> Iterator[nnx.Module]:
  """Within the block, every RoPE of `model` uses `scaling` (None: plain).
  A model without RoPE is an error: the scaling would silently do nothing."""
  modules = rope_modules(model)
  if scaling is not None and not modules:
    raise ValueError(f'RoPE scaling {scaling.method!r} asked for a model without RoPE '
                     f'({type(model).__name__}).')
  saved = [m.scaling for m in modules]
  try:
    for m in modules:
      m.scaling = scaling
    yield model
  finally:
    for m, s in zip(modules, saved):
      m.scaling = s


def evaluation_variants(run: Union[ResolvedRun, ml_collections.ConfigDict]
                        ) -> list[tuple[str, Optional[RopeScaling]]]:
  """(label, RoPE scaling) per evaluation of a trained model: the model as
  trained, then, for plain 'rope' models, each of `eval.rope_scalings`
  (label 'rope+METHOD'), with factor `eval.rope_scale_factor` (0: longest
  evaluated / longest training sequence) and L the longest training sequence.
  `run`: the run's record (`config.resolved`) or its config."""
  run = resolve(run)
  config = run.config
  variants = [(entries.run_label(config), None)]
  # Not a variant built on RoPE (rnope_swa): its rows would take plain rope's labels.
  if (config.model.kind == 'transformer' and config.model.encoding == 'rope'
      and not config.model.get('variant')):
    train_tokens = tasks.tokens_read(run.task, config.task.train_max_length)
    factor = config.eval.rope_scale_factor or run.longest_sequence / train_tokens
    for method in config.eval.rope_scalings:
      variants.append((f'rope+{method}', RopeScaling(method, factor, train_tokens)))
  return variants
