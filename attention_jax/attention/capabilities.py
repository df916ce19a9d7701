"""What a kernel can serve and what a call asks, for `dispatch.py`'s table:
the `Kernel` row's capability columns, the `Request` a call makes, and the
obstacles of lengths, head dims and structure between the two.

Score specs (`scores.py`) are not columns: a row lists the kinds it takes
(`accepts`, a set of spec classes) and a request the specs it carries, so a
new kind of spec adds no column, field or obstacle here.
"""

import dataclasses
from typing import Callable, Optional

from attention_jax.attention.scores import ScoreSpec


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One row of the table: a run function and what it can serve.

  `run(q, k, v, *, mask, scores, causal, window, kv_lengths, normalization,
  q_slots, return_weights, chunk_size, chunked_strategy) -> (out, weights or
  None)`, and for a call with segment ids (only to a row that declares
  `segment_ids`) also `segment_ids=(q ids [B, T_q], kv ids [B, T_k])`,
  int32 (`segments.py`); mask rank 4 or None, scores a tuple of score
  specs (`scores.py`),
  each of a class in `accepts` (the call's `bias=` array is a `DenseBias`
  among them), normalization None (softmax) or a `StickBreaking`, q_slots
  int `[T_q]` or None (stick-breaking over a cache); and, only when the
  call sets them (rows with `soft_cap` / `sinks`), `logit_soft_cap` a
  positive float and `sinks` float32 `[H]`.
  """
  run: Callable
  weights: bool  # can return the attention weights
  dense_mask: bool  # takes an arbitrary boolean mask
  # The kinds of score spec it takes: their classes or a base of them
  # (`ScoreSpec`: any kind with a dense form, for a row that materialises);
  # a row that does not `materialise` takes at most one term of each.
  accepts: frozenset = frozenset()
  normalizations: tuple[str, ...] = ('softmax',)  # `normalization.NORMALIZATIONS` served
  dtypes: Optional[tuple[str, ...]] = None  # input dtypes served; None: any
  backends: Optional[tuple[str, ...]] = None  # JAX backends; None: any
  # Head dims served: any of these (a multiple of, at most: None for no bound); None: any.
  head_dim: Optional[tuple[tuple[int, Optional[int]], ...]] = None
  value_dim: bool = True  # takes D_v != D
  window: str = 'symmetric'  # windows: 'none', 'left' (with causal only) or 'symmetric'
  padding: bool = True  # takes kv_lengths
  # The normalizations under which it takes segment ids (packed documents,
  # `segments.py`); empty: none.
  segment_ids: tuple[str, ...] = ()
  causal_only: bool = False  # serves causal attention only (PaTH's transforms run forward)
  length_multiple: int = 1  # T_q and T_k multiples of this
  score_broadcast: bool = True  # takes a mask or bias of size 1 along T_q or T_k
  bias_length_multiple: int = 1  # with a mask or a bias: T_q and T_k multiples of this
  auto_min_keys: int = 0  # 'auto' picks it only from this many keys on
  # Turns a compact spec (LinearBias, DifferenceBias, WindowBias) into a
  # [T_q, T_k] array ('auto' prefers a row that builds it block by block or
  # in the kernel).
  materialises: bool = False
  # XLA can partition it across a mesh (False: a Pallas custom call, run per
  # device on its share of the batch, `partition.py`).
  partitionable: bool = True
  # Logit soft-capping (`logit_soft_cap=`, `soft_cap.py`) and learned sink
  # logits (`sinks=`, `sink_logits.py`), built in by the row; a row that
  # serves one takes that keyword in its run function (the dispatcher passes
  # it only when the call sets it).
  soft_cap: bool = False
  sinks: bool = False


@dataclasses.dataclass(frozen=True)
class Request:
  """What a call asks of a kernel. `scores` holds its score specs (the
  refusals name their kind and origin), or for a question without arrays
  their classes, e.g. `(LinearBias,)`; `t_q` None and `v_head_dim` None
  stand for `t_k` and `head_dim`."""
  t_k: int
  dtype: object
  head_dim: int
  return_weights: bool = False
  dense_mask: bool = False
  scores: tuple = ()
  normalization: str = 'softmax'
  t_q: Optional[int] = None
  v_head_dim: Optional[int] = None
  causal: bool = False
  window: Optional[int] = None
  kv_lengths: bool = False
  gqa: bool = False  # fewer key/value heads than query heads
  score_broadcast: bool = False  # a mask or bias of size 1 along T_q or T_k
  batch: int = 1
  segment_ids: bool = False  # packed documents: segment ids on queries and keys
  soft_cap: bool = False  # logit_soft_cap= given
  sinks: bool = False  # sinks= given


def kind_of(spec) -> type:
  """The class of a request's score spec (given as a spec or as its class)."""
  return spec if isinstance(spec, type) else type(spec)


def takes(kernel: Kernel, kind: type) -> bool:
  """Whether `kernel` takes score specs of class `kind`: a subclass of one
  of its `accepts`, and for a row that materialises, with a dense form."""
  return (any(issubclass(kind, a) for a in kernel.accepts)
          and (not kernel.materialises or kind.dense is not ScoreSpec.dense))


def head_dims(rules) -> str:
  return ' or '.join(
      ' '.join(([f'a multiple of {m}'] if m > 1 else [])
               + ([f'up to {most}'] if most is not None else [])) for m, most in rules)


def window_obstacle(kernel: Kernel, request: Request) -> Optional[str]:
  if request.window is None or kernel.window == 'symmetric':
    return None
  if kernel.window == 'none':
    return f'window={request.window} (it serves no sliding window)'
  if not request.causal:  # kernel.window == 'left'
    return (f'window={request.window} without causal=True (it serves a causal, '
            'left-only window)')
  return None


def logit_obstacles(kernel: Kernel, request: Request, servers) -> list[str]:
  """The call's soft cap and sink logits, where `kernel` does not serve
  them; `servers(column)` names the rows that do."""
  found = []
  if request.soft_cap and not kernel.soft_cap:
    found.append(f'logit_soft_cap= (it does not cap the scores; {servers("soft_cap")})')
  if request.sinks and not kernel.sinks:
    found.append(f'sinks= (its softmax has no learned sink logit; {servers("sinks")})')
  return found


def shape_obstacles(kernel: Kernel, request: Request) -> list[str]:
  """The obstacles of lengths, head dims and structure."""
  found = []
  t_q = request.t_k if request.t_q is None else request.t_q
  lengths = f'(got T_q={t_q}, T_k={request.t_k})'
  if t_q % kernel.length_multiple or request.t_k % kernel.length_multiple:
    found.append(f'T_q and T_k multiples of {kernel.length_multiple} {lengths}')
  scores = request.dense_mask or request.scores
  step = kernel.bias_length_multiple
  if scores and (t_q % step or request.t_k % step):
    found.append(f'with a mask or bias, T_q and T_k multiples of {step} {lengths}')
  if request.score_broadcast and not kernel.score_broadcast:
    found.append('a mask or bias broadcast along T_q or T_k (it takes them [.., T_q, T_k])')
  if kernel.head_dim and not any(
      request.head_dim % m == 0 and (most is None or request.head_dim <= most)
      for m, most in kernel.head_dim):
    found.append(f'head_dim {head_dims(kernel.head_dim)} (got {request.head_dim})')
  d_v = request.head_dim if request.v_head_dim is None else request.v_head_dim
  if d_v != request.head_dim and not kernel.value_dim:
    found.append(f'D_v == D (got D={request.head_dim}, D_v={d_v})')
  window = window_obstacle(kernel, request)
  if window:
    found.append(window)
  if kernel.causal_only and not request.causal:
    found.append('causal=False (it serves causal attention only)')
  if request.kv_lengths and not kernel.padding:
    found.append('kv_lengths= (key padding)')
  return found
