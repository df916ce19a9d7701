"""The one entry point of multi-head attention: validates a call, picks the
kernel once from a table of what each kernel can serve, and hands it the
mask and the call's score specs whole.

`KERNELS` maps a name to a `Kernel` row: its run function (in its own file)
and its capabilities, among them the kinds of score spec it takes
(`accepts`). 'auto' takes the first row, in table order, that can serve the
call; naming a kernel that cannot is an error listing every obstacle (a
spec of a kind the row does not take is named with the rows that do). A new
kernel is one file with its run function and one row here (or
`register_kernel` from outside the package). A new kind of score spec is a
`scores.ScoreSpec` subclass: with a dense form, the rows that materialise
(`ANY_SPEC`) take it as it is; a row that builds it its own way names it in
its `accepts`.

* 'cudnn'   (`cudnn.py`): the fused GPU kernel; half precision; no weights;
  softmax only; windows causal only; a mask or bias of full T_q × T_k, with
  even lengths; D_v == D.
* 'splash'  (`splash.py`): JAX's Pallas splash attention, TPU only; structure
  only (causal, window, kv_lengths, segment ids: its `SegmentIds`); softmax;
  lengths multiples of 128.
* 'pallas_tpu' (`pallas_tpu.py`), 'pallas_gpu' (`pallas_gpu.py`): ours,
  Pallas on Mosaic (TPU) and on Triton (GPU); FlashAttention-2 with the
  biases built in the kernel from their specs (ALiBi's slopes, difference
  biases, per-head windows on position ids) and structure (causal, window,
  kv_lengths, GQA, segment ids); softmax; no dense mask or bias, no
  weights; O(T) memory.
* 'chunked' (`chunked.py`): blockwise, O(T) memory; masks by structure only
  (causal, kv_lengths, window, segment ids), linear biases (ALiBi's slopes)
  and difference biases (forgetting attention's gates), both built block by
  block; softmax and stick-breaking (without segment ids); no weights.
  'auto' takes it from `AUTO_CHUNKED_MIN_KEYS` keys on.
* 'path_blockwise' (`path_blockwise.py`): PaTH attention (a
  `HouseholderScores` spec, `path.py`) block by block, O(T) memory, with a
  difference bias (PaTH-FoX's gate); causal only, kv_lengths, no window or
  dense mask, no segment ids; softmax; no weights. 'auto' takes it for PaTH
  from `path_blockwise.AUTO_MIN_KEYS` keys on; below, and with segment ids,
  the dense kernel materialises the spec.
* 'tpu_flash' (`tpu_flash.py`): JAX's Pallas flash attention, TPU only;
  any bias, materialised to the full [B, H, T_q, T_k] (O(T²) memory, which
  is why it comes after 'chunked': 'auto' takes it for a dense bias);
  causal, kv_lengths, no window; softmax; D_v == D; lengths multiples of 128.
* 'dense'   (`dense.py`): any mask and bias, segment ids, softmax and
  stick-breaking, returns the weights; O(T²) memory.

Segment ids (packed documents, `segments.py`) are served by the rows that
declare them (`Kernel.segment_ids`): 'splash', 'pallas_tpu', 'pallas_gpu',
'chunked' and 'dense' (softmax; 'dense' also stick-breaking). cuDNN through
jax.nn has none (its packed layout, q_offsets/kv_offsets, is private to
`jax._src.cudnn`); 'tpu_flash' (JAX's older flash kernel) is not wired for
them, nor is 'path_blockwise' (its blocks mask by causality and padding
only; PaTH with segment ids goes to 'dense').

Gemma 2's `logit_soft_cap` and gpt-oss's learned `sinks` (one logit per
query head in the softmax's denominator): 'splash', 'pallas_tpu',
'pallas_gpu', 'chunked' and 'dense' serve them (`Kernel.soft_cap`,
`Kernel.sinks`), with segment ids too; 'cudnn' and 'tpu_flash' cannot
(JAX's APIs take neither).

On CPU 'auto' never picks jax.nn's XLA path, whose backward is
pathologically slow there.

Shapes: q `[B, T_q, H, D]`, k `[B, T_k, H_kv, D]`, v `[B, T_k, H_kv, D_v]`.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.attention.capabilities import Kernel
from attention_jax.attention.capabilities import Request
from attention_jax.attention.capabilities import kind_of
from attention_jax.attention.capabilities import logit_obstacles
from attention_jax.attention.capabilities import takes
from attention_jax.attention.capabilities import shape_obstacles
from attention_jax.attention.chunked import STRATEGIES
from attention_jax.attention.chunked import chunked_kernel
from attention_jax.attention.cudnn import cudnn_kernel
from attention_jax.attention.checks import as_bool_mask
from attention_jax.attention.checks import check_array
from attention_jax.attention.checks import check_flag
from attention_jax.attention.checks import check_lengths
from attention_jax.attention.checks import check_qkv
from attention_jax.attention.heads import as_rank4
from attention_jax.attention.heads import check_broadcast
from attention_jax.attention.dense import dense_kernel
from attention_jax.attention.masked_values import finite_values
from attention_jax.attention.masked_values import masks_by_structure
from attention_jax.attention.masked_values import restore_non_finite
from attention_jax.attention.normalization import Normalization
from attention_jax.attention.normalization import as_normalization
from attention_jax.attention.normalization import name_of
from attention_jax.attention.pallas_gpu import pallas_gpu_kernel
from attention_jax.attention.partition import batch_obstacle
from attention_jax.attention.partition import context_mesh
from attention_jax.attention.partition import per_device
from attention_jax.attention.pallas_tpu import pallas_tpu_kernel
from attention_jax.attention.path import HouseholderScores
from attention_jax.attention.path_blockwise import AUTO_MIN_KEYS as PATH_AUTO_MIN_KEYS
from attention_jax.attention.path_blockwise import path_blockwise_kernel
from attention_jax.attention.scores import DenseBias
from attention_jax.attention.scores import DifferenceBias
from attention_jax.attention.scores import LinearBias
from attention_jax.attention.scores import NoBias
from attention_jax.attention.scores import ScoreBias
from attention_jax.attention.scores import ScoreSpec
from attention_jax.attention.scores import WindowBias
from attention_jax.attention.scores import as_terms
from attention_jax.attention.scores import describe
from attention_jax.attention.segments import check_segment_ids
from attention_jax.attention.sink_logits import check_sinks
from attention_jax.attention.soft_cap import check_soft_cap
from attention_jax.attention.splash import LENGTH_MULTIPLE
from attention_jax.attention.splash import splash_kernel
from attention_jax.attention.tpu_flash import tpu_flash_kernel

# Where chunked beats dense for a causal layer fwd+bwd on the 2-core CPU; see
# benchmarks/README.md, "The 'auto' threshold".
AUTO_CHUNKED_MIN_KEYS = 256


# The kinds of score spec a row takes (`Kernel.accepts`): ANY_SPEC, every
# kind with a dense form (the rows that materialise them, `scores.materialise`).
ANY_SPEC = frozenset({ScoreSpec})
COMPACT_SPECS = frozenset({LinearBias, DifferenceBias, WindowBias})

KERNELS = {
    'cudnn': Kernel(cudnn_kernel, weights=False, dense_mask=True, accepts=ANY_SPEC,
                    dtypes=('float16', 'bfloat16'), backends=('gpu',), head_dim=((8, 128),),
                    value_dim=False, window='left', score_broadcast=False,
                    bias_length_multiple=2, materialises=True),
    'splash': Kernel(splash_kernel, weights=False, dense_mask=False,
                     dtypes=('float32', 'bfloat16'), backends=('tpu',),
                     length_multiple=LENGTH_MULTIPLE, partitionable=False,
                     segment_ids=('softmax',), soft_cap=True, sinks=True),
    'pallas_tpu': Kernel(pallas_tpu_kernel, weights=False, dense_mask=False,
                         accepts=COMPACT_SPECS, dtypes=('float32', 'bfloat16'),
                         backends=('tpu',), partitionable=False, segment_ids=('softmax',),
                         soft_cap=True, sinks=True),
    'pallas_gpu': Kernel(pallas_gpu_kernel, weights=False, dense_mask=False,
                         accepts=COMPACT_SPECS, dtypes=('float32', 'bfloat16', 'float16'),
                         backends=('gpu',), partitionable=False, segment_ids=('softmax',),
                         soft_cap=True, sinks=True),
    'chunked': Kernel(chunked_kernel, weights=False, dense_mask=False,
                      accepts=frozenset({LinearBias, DifferenceBias}),
                      normalizations=('softmax', 'stick_breaking'),
                      segment_ids=('softmax',), auto_min_keys=AUTO_CHUNKED_MIN_KEYS,
                      soft_cap=True, sinks=True),
    # No segment ids: its blocks mask by causality and padding only (wiring
    # them is a keep-mask in `path_blockwise`'s score blocks); PaTH with
    # segment ids goes to 'dense', which masks the materialised spec.
    'path_blockwise': Kernel(path_blockwise_kernel, weights=False, dense_mask=False,
                             accepts=frozenset({HouseholderScores, DifferenceBias}),
                             window='none', causal_only=True, segment_ids=(),
                             auto_min_keys=PATH_AUTO_MIN_KEYS),
    'tpu_flash': Kernel(tpu_flash_kernel, weights=False, dense_mask=False, accepts=ANY_SPEC,
                        dtypes=('float32', 'bfloat16'), backends=('tpu',),
                        head_dim=((1, 128), (128, None)), value_dim=False, window='none',
                        length_multiple=LENGTH_MULTIPLE, materialises=True,
                        partitionable=False),
    'dense': Kernel(dense_kernel, weights=True, dense_mask=True, accepts=ANY_SPEC,
                    normalizations=('softmax', 'stick_breaking'), materialises=True,
                    segment_ids=('softmax', 'stick_breaking'), soft_cap=True, sinks=True),
}
# The built-in implementations; `implementations()` adds registered ones.
IMPLEMENTATIONS = (*KERNELS, 'auto')


def implementations() -> tuple[str, ...]:
  """Every kernel name `implementation=` takes now, and 'auto'."""
  return (*KERNELS, 'auto')


def register_kernel(name: str, kernel: Kernel, *, before: Optional[str] = None) -> None:
  """Adds a row to `KERNELS` (last, or just before row `before`: 'auto'
  tries rows in order), e.g. a kernel of your own that takes a kind of score
  spec of your own (`Kernel(run, ..., accepts=frozenset({MySpec}))`)."""
  if not isinstance(name, str) or name in implementations():
    raise ValueError(f'register_kernel: name={name!r} must be a new string (taken: '
                     f'{implementations()}).')
  if not isinstance(kernel, Kernel):
    raise TypeError(f'register_kernel: kernel must be a Kernel row, got '
                    f'{type(kernel).__name__}.')
  if before is not None and before not in KERNELS:
    raise ValueError(f'register_kernel: before={before!r}; choose one of {tuple(KERNELS)}.')
  rows = list(KERNELS.items())
  at = len(rows) if before is None else list(KERNELS).index(before)
  rows.insert(at, (name, kernel))
  KERNELS.clear()
  KERNELS.update(rows)


def check_options(implementation: str = 'auto', chunked_strategy: str = 'auto',
                  chunk_size: Optional[int] = None, window: Optional[int] = None) -> None:
  """Refuses unknown options, whichever kernel would run (modules call it at
  construction, `scaled_dot_product_attention` at every call)."""
  if implementation not in implementations():
    raise ValueError(f'implementation={implementation!r}; choose one of '
                     f'{implementations()}.')
  if chunked_strategy not in STRATEGIES:
    raise ValueError(f'chunked_strategy={chunked_strategy!r}; choose one of {STRATEGIES}.')
  for name, value in (('chunk_size', chunk_size), ('window', window)):
    if value is not None and (not isinstance(value, (int, np.integer))
                              or isinstance(value, bool) or value < 1):
      raise ValueError(f'{name}={value!r}: use an integer >= 1 or None.')


def current_backend() -> str:
  """The backend `obstacles` checks when given none: JAX's default (the
  lowering tests patch it to trace as on another platform)."""
  return jax.default_backend()


def obstacles(name: str, request: Request, backend: Optional[str] = None) -> list[str]:
  """Why kernel `name` cannot serve `request` (empty: it can) on `backend`
  (default: `current_backend()`)."""
  kernel, backend = KERNELS[name], backend or current_backend()
  found = []
  if request.return_weights and not kernel.weights:
    found.append('return_weights=True (only ' + ', '.join(
        repr(n) for n, k in KERNELS.items() if k.weights) + ' forms the weights)')
  if request.dense_mask and not kernel.dense_mask:
    found.append('a dense mask (give causal=, window= or kv_lengths= instead)')
  found += score_obstacles(kernel, request)
  found += logit_obstacles(kernel, request, servers)
  if request.normalization not in kernel.normalizations:
    found.append(f'normalization={request.normalization!r} (it serves '
                 f'{", ".join(kernel.normalizations)})')
  if kernel.backends and backend not in kernel.backends:
    found.append(f"a {' or '.join(b.upper() for b in kernel.backends)} "
                 f'(the default backend is {backend!r})')
  dtype = jnp.dtype(request.dtype)
  if kernel.dtypes and dtype.name not in kernel.dtypes:
    found.append(f"{' or '.join(kernel.dtypes)} inputs (got {dtype.name})")
  found += shape_obstacles(kernel, request)
  if request.segment_ids and request.normalization not in kernel.segment_ids:
    found.append(segment_obstacle(kernel, request))
  if not kernel.partitionable:
    found += filter(None, [batch_obstacle(request.batch, context_mesh())])
  return found


def segment_obstacle(kernel: Kernel, request: Request) -> str:
  """Why `kernel` cannot take the call's segment ids, naming the rows that can."""
  norm = request.normalization
  names = ', '.join(repr(n) for n, k in KERNELS.items() if norm in k.segment_ids)
  served = f'{names} serve{"s" if names.count(",") == 0 else ""} them' if names else (
      'no kernel serves them')
  if kernel.segment_ids:
    return (f'segment_ids= with normalization={norm!r} (it serves segment ids with '
            f'{", ".join(kernel.segment_ids)}; {served})')
  return f'segment_ids= (packed documents: it builds no segment mask; {served})'


def servers(column: str) -> str:
  """The rows whose capability `column` (a `Kernel` field) is on, for a
  refusal."""
  names = [repr(n) for n, k in KERNELS.items() if getattr(k, column)]
  return (', '.join(names) + (' serves' if len(names) == 1 else ' serve') + ' it' if names
          else 'no kernel serves it')


def takers(kind: type) -> str:
  """The rows that take score specs of class `kind`, for a refusal."""
  names = [repr(n) for n, k in KERNELS.items() if takes(k, kind)]
  return (', '.join(names) + (' takes' if len(names) == 1 else ' take') + ' it' if names
          else 'no kernel takes it: register one that does (register_kernel)')


def score_obstacles(kernel: Kernel, request: Request) -> list[str]:
  """The call's score specs of a kind `kernel` does not take, each named with
  the rows that do; and for a row that builds each kind itself (not
  `materialises`), a kind given twice."""
  found, kinds = [], [kind_of(s) for s in request.scores]
  for spec, kind in zip(request.scores, kinds):
    if not takes(kernel, kind):
      found.append(f'{describe(spec)} [{kind.__name__}: {takers(kind)}]')
  twice = sorted({k.__name__ for k in kinds if kinds.count(k) > 1 and takes(kernel, k)})
  if twice and not kernel.materialises:
    found.append(f'more than one {" or ".join(twice)} (it builds one of each kind)')
  return found


def select_implementation(requested: str, request: Request,
                          backend: Optional[str] = None) -> str:
  """The kernel a call runs on: `requested` itself when it can serve the call
  (else an error naming every obstacle), or for 'auto' the first row of
  `KERNELS` that can and whose `auto_min_keys` the call reaches, preferring
  for a call with a compact score spec (`ScoreSpec.compact`: linear,
  difference, windows) a row that does not materialise it: O(T) memory
  wherever a backend has such a row."""
  check_options(requested)
  if requested != 'auto':
    found = obstacles(requested, request, backend)
    if found:
      raise ValueError(f'implementation={requested!r} cannot serve this call: '
                       + '; '.join(found) + ". Use 'dense' or 'auto'.")
    return requested
  refusals = {name: obstacles(name, request, backend) for name in KERNELS}
  spec = any(kind_of(s).compact for s in request.scores)
  for avoid_materialising in ((True, False) if spec else (False,)):
    for name, kernel in KERNELS.items():
      if (not refusals[name] and request.t_k >= kernel.auto_min_keys
          and not (avoid_materialising and kernel.materialises)):
        return name
  raise ValueError('no kernel can serve this call: ' + ' | '.join(
      f'{n}: ' + '; '.join(f) for n, f in refusals.items() if f) + '.')


def scaled_dot_product_attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *,
    mask: Optional[jnp.ndarray] = None, bias: Optional[jnp.ndarray] = None,
    score_bias: ScoreBias = NoBias(), causal: bool = False,
    kv_lengths: Optional[jnp.ndarray] = None, window: Optional[int] = None,
    normalization: Normalization = 'softmax', q_slots: Optional[jnp.ndarray] = None,
    implementation: str = 'auto', return_weights: bool = False,
    chunk_size: Optional[int] = None, chunked_strategy: str = 'auto',
    segment_ids: Optional[jnp.ndarray] = None, kv_segment_ids: Optional[jnp.ndarray] = None,
    logit_soft_cap: Optional[float] = None, sinks: Optional[jnp.ndarray] = None):
  """Multi-head attention on the kernel that can serve it (module docstring).

  Args:
    q, k, v: `[B, T_q, H, D]`, `[B, T_k, H_kv, D]`, `[B, T_k, H_kv, D_v]`.
    mask: boolean `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`, True = attend
      (rank 3 is ambiguous and refused); a concrete float mask of exact 0s
      and 1s (Flax's `nnx.make_attention_mask`) is converted, other floats
      and a traced float mask are refused (`checks.as_bool_mask`).
    bias: additive, `[T_q, T_k]` or `[B|1, H|1, T_q, T_k]`.
    score_bias: an encoding's contribution (`scores.py`): `NoBias()` (or
      None), one spec (`LinearBias(slopes)`, `DifferenceBias(q_values,
      k_values)`, `WindowBias(lows, highs, q_positions, k_positions)`,
      `DenseBias(bias)` or a `ScoreSpec` kind of your own) or a tuple of
      them; added to `bias`.
    causal: query i attends to keys j <= i (needs T_q == T_k).
    kv_lengths: int `[B]`, each in [0, T_k]: keys at index >= kv_lengths[b]
      are padding. Refused outside the range when concrete; under `jit` a
      negative length masks every key of its row, one above T_k none.
    window: query i attends to keys with |i - j| < window.
    normalization: 'softmax', 'stick_breaking' or a `StickBreaking`
      (`normalization.py`); stick-breaking needs `causal=True` or `q_slots`.
    q_slots: int `[T_q]`, each query's own key index, for stick-breaking over
      a key/value cache (the mask then carries causality); None otherwise.
    implementation: a key of `KERNELS` ('cudnn', 'splash', 'chunked',
      'tpu_flash', 'dense') or 'auto'.
    return_weights: also return float32 `[B, H, T_q, T_k]` (kernels with
      `weights`: 'dense').
    chunk_size: query and key block size of the chunked kernel (default:
      `chunked_attention`'s, per strategy).
    chunked_strategy: 'scan' | 'unrolled' | 'auto', see `chunked_attention`.
    segment_ids: int `[B, T_q]`, the queries' document ids (packed rows):
      query i attends key j only where the ids are equal, besides every
      other mask (`segments.py`: conventions, padding). Also the keys' ids
      when `kv_segment_ids` is None (self-attention, T_q == T_k). Served by
      the rows that declare `segment_ids` (module docstring).
    kv_segment_ids: int `[B, T_k]`, the keys' ids (cross-attention, or
      different ids on the two sides, as for padding); needs segment_ids.
    logit_soft_cap: None, or a positive finite c: every score s (scaled, with
      the biases added) becomes `c · tanh(s / c)` before the mask (Gemma 2;
      `soft_cap.py`). Softmax only.
    sinks: None, or float `[H]`: one learned logit per query head joining
      the softmax's denominator only, so the weights sum to less than 1
      (gpt-oss; `sink_logits.py`; not `WindowBias(sink=)`'s visible first
      tokens). Gradients flow to it. Softmax only.

  Returns:
    out `[B, T_q, H, D_v]` in the dtype of v, or `(out, weights)` with
    `return_weights`.

  Keys masked by `kv_lengths`, `causal` or `window` have no influence on any
  kernel, even with NaN or ±inf values: every other output and every
  gradient is as with finite values there; feature d of query i is NaN where
  a key it sees by that structure has a non-finite v[d]
  (`masked_values.py`). A key masked only by `mask` or `segment_ids` has no
  such guarantee: a non-finite value there turns NaN the outputs of the
  queries whose structural range holds it (0 · NaN).
  """
  check_options(implementation, chunked_strategy, chunk_size, window)
  q, k, v = check_qkv(q, k, v, 'scaled_dot_product_attention')
  causal = check_flag(None, 'causal', causal)
  return_weights = check_flag(None, 'return_weights', return_weights)
  t_q, t_k = q.shape[1], k.shape[1]
  if causal and t_q != t_k:
    raise ValueError(f'causal=True needs T_q == T_k, got {t_q} and {t_k}.')
  kv_lengths = check_lengths('kv_lengths', kv_lengths, q.shape[0], t_k)
  if q_slots is not None:
    q_slots = check_array('q_slots', q_slots, ndim=1, kind='integer')
    if q_slots.shape != (t_q,):
      raise ValueError(f'q_slots must be [T_q={t_q}] (each query\'s key index), got shape '
                       f'{tuple(q_slots.shape)}.')
  mask = as_bool_mask('mask', None if mask is None else check_array('mask', mask))
  bias = None if bias is None else check_array('bias', bias, kind='floating')
  mask, bias = as_rank4('mask', mask), as_rank4('bias', bias)
  full = (q.shape[0], q.shape[2], t_q, t_k)
  for name, x in (('mask', mask), ('bias', bias)):
    if x is not None:
      check_broadcast(name, x, full)
  scores = ((() if bias is None else (DenseBias(bias, origin='the bias= argument'),))
            + as_terms(score_bias))
  for term in scores:
    term.check(q.shape[0], q.shape[2], t_q, t_k)
  segments = check_segment_ids(segment_ids, kv_segment_ids, q.shape[0], t_q, t_k)
  check_soft_cap(logit_soft_cap)
  sinks = check_sinks(sinks, q.shape[2])
  norm = as_normalization(normalization)
  if norm is not None and (logit_soft_cap is not None or sinks is not None):
    raise ValueError(
        'logit_soft_cap= and sinks= act on a softmax, not on stick-breaking: its remainder '
        'already takes what the keys leave (no denominator for a sink logit to join) and '
        'σ(z) already bounds each key\'s share (nothing for a cap to tame); got '
        f'normalization={normalization!r}.')
  if norm is not None and not causal and q_slots is None:
    raise ValueError('stick-breaking attention reads the keys before each query: it needs '
                     'causal=True, or q_slots (each query\'s key index) with a mask.')
  broadcast = ((mask is not None and mask.shape[-2:] != (t_q, t_k))
               or any(term.broadcasts(t_q, t_k) for term in scores))
  request = Request(t_k=t_k, dtype=q.dtype, head_dim=q.shape[-1],
                    return_weights=return_weights, dense_mask=mask is not None,
                    scores=scores, normalization=name_of(norm),
                    t_q=t_q, v_head_dim=v.shape[-1], causal=causal, window=window,
                    kv_lengths=kv_lengths is not None, gqa=k.shape[2] < q.shape[2],
                    score_broadcast=broadcast, batch=q.shape[0],
                    segment_ids=segments is not None,
                    soft_cap=logit_soft_cap is not None, sinks=sinks is not None)
  name = select_implementation(implementation, request)
  kernel, mesh = KERNELS[name], context_mesh()
  run = kernel.run
  if mesh is not None and not kernel.partitionable:  # a custom call: per device
    run = lambda *a, **kw: per_device(kernel.run, mesh, *a, **kw)
  # Only a row that declares segment ids, a soft cap or sinks is handed them
  # (a registered row written before them need not take the arguments).
  extra = {} if segments is None else dict(segment_ids=segments)
  if logit_soft_cap is not None:
    extra['logit_soft_cap'] = float(logit_soft_cap)
  if sinks is not None:
    extra['sinks'] = sinks
  # Keys hidden by structure have no influence, whatever their values hold
  # (`masked_values.py`): every kernel gets finite values.
  guard = masks_by_structure(causal, window, kv_lengths)
  if guard:
    v, bad = finite_values(v)
  out, weights = run(
      q, k, v, mask=mask, scores=scores,
      causal=causal, window=window, kv_lengths=kv_lengths, normalization=norm,
      q_slots=q_slots, return_weights=return_weights, chunk_size=chunk_size,
      chunked_strategy=chunked_strategy, **extra)
  if guard:
    out = restore_non_finite(out, bad, causal=causal, window=window, kv_lengths=kv_lengths)
  return (out, weights) if return_weights else out
