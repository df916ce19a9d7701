"""Accuracy per input length, far beyond the training lengths.

Padding is invisible to the real tokens: under the causal mask for the
transformer, through `seq_lengths` and the attention mask for seq2seq models.

Lengths are grouped into buckets (powers of two of the input length, at least
the training maximum): every length in a bucket is padded to the bucket's size
and shares one compiled program, so evaluating dozens of lengths costs a
handful of compilations; results do not depend on the bucketing (tested).

Evaluation data depend on `(eval_seed, length)` only: every encoding and every
training seed is scored on the same sequences.

Two ways to score a transformer: teacher forcing (every prediction sees the
true prefix; the default) and, with `generate=True`, real greedy generation
through the key/value cache. Exact match is the same under both by
construction (all outputs right under teacher forcing ⇔ greedy decoding
reproduces them); `generation_agreement`, the fraction of sequences on which
the two verdicts agree, checks the cached decoding path against it.
"""

import functools
import math
from typing import Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.lab.protocols import decoder
from attention_jax.lab import tasks
from attention_jax.lab.evaluate.scoring import prediction_metrics
from attention_jax.lab.runs.timing import Stopwatch
from attention_jax.lab.train.interrupt import raise_if_stopped


def buckets(lengths: Sequence[int], train_max: int) -> dict[int, list[int]]:
  """Maps each bucket size (max input length) to the lengths padded to it.

  Sizes are powers of two, at least `train_max` and at most `max(lengths)`,
  so no bucket pads past the longest length asked for (a learned table ends
  there)."""
  out: dict[int, list[int]] = {}
  longest = max(lengths)
  for n in lengths:
    size = train_max if n <= train_max else min(longest, 2 ** math.ceil(math.log2(n)))
    out.setdefault(size, []).append(n)
  return out


# Compiled evaluation programs kept alive at once (the LRU below).
PROGRAMS_KEPT = 8


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def evaluation_program(*, graphdef, task: tasks.DecoderTask, bucket: int, num_samples: int,
                       vocab_size: int, max_position: int = 0, draw: str = 'per_example',
                       generate: bool = False, stacked: bool = False):
  """`(state, key, n) -> metrics`, jitted: `_metrics`, or with `stacked` the
  metrics `[S, ...]` of S models whose states are stacked on a leading axis,
  on the same batch, in one program.

  Memoised on the static arguments, a few at a time: the lengths of a
  bucket (and the runs of one architecture) share one compilation, and a
  long sweep does not keep every program it ever compiled. That matters:
  each compiled program holds memory mappings of its machine code (hundreds
  for one of these), a process may have at most `vm.max_map_count` (65,530
  by default on Linux), and keeping them all crashed the 117-run
  `size=all` study after ~30 setups ("LLVM compilation error: Cannot
  allocate memory", then a segmentation fault). An evicted function is
  freed with its programs."""

  def evaluate(state, key, n):
    metrics = functools.partial(
        _metrics, key=key, n=n, graphdef=graphdef, task=task, bucket=bucket,
        num_samples=num_samples, vocab_size=vocab_size, max_position=max_position,
        draw=draw, generate=generate)
    return jax.vmap(metrics)(state) if stacked else metrics(state)

  return jax.jit(evaluate)


def _metrics(state, *, key, n, graphdef, task, bucket, num_samples, vocab_size,
             max_position, draw, generate) -> dict[str, jax.Array]:
  """Metrics on `num_samples` sequences of input length `n` (traced) padded
  to `bucket`: one compilation per bucket, shared by models of one shape.
  Without `generate`: `decoder.predict_batch`'s accuracies (teacher-forced
  argmax for the transformer, greedy decoding for seq2seq models) and
  `exact`, bool `[num_samples]`; with it, only `exact` of
  `decoder.generate_batch`'s predictions (a program of its own, so its time
  is its own). `max_position` > 0: randomized positions."""
  model = nnx.merge(graphdef, state)
  lengths = task.fixed_lengths(n, num_samples)
  batch = tasks.LAYOUTS[decoder.batch_layout(model)](
      task, key, lengths, vocab_size=vocab_size, max_input_length=bucket)
  if max_position:
    batch = tasks.with_random_positions(batch, jax.random.fold_in(key, 2), max_position, draw)
  if generate:
    return prediction_metrics(decoder.generate_batch(model, batch), batch, per_example=True)
  predictions = decoder.predict_batch(model, batch)
  return dict(prediction_metrics(predictions, batch),
              **prediction_metrics(predictions, batch, per_example=True))


def evaluation_keys(eval_seed: int, n: int, num_batches: int) -> jax.Array:
  """The keys of length `n`'s evaluation batches: the data of every model."""
  return jax.random.split(jax.random.fold_in(jax.random.key(eval_seed), n), num_batches)


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _strings_program(task, bucket: int, batch_size: int, vocab_size: int, max_position: int,
                     draw: str):
  """`(key, n) -> batch`, jitted: `_metrics`' batch of length n (traced) in
  `bucket`, one compilation per bucket rather than op by op per length."""

  def build(key, n):
    batch = tasks.make_batch(task, key, task.fixed_lengths(n, batch_size),
                             vocab_size=vocab_size, max_input_length=bucket)
    if max_position:  # as `_metrics` draws them
      batch = tasks.with_random_positions(batch, jax.random.fold_in(key, 2), max_position, draw)
    return batch

  return jax.jit(build)


def evaluation_strings(task: tasks.DecoderTask, lengths: Iterable[int], *, train_max: int,
                       num_samples: int, vocab_size: int, eval_seed: int = 12345,
                       batch_size: int = 256, max_position: int = 0,
                       draw: str = 'per_example') -> dict[int, dict[str, np.ndarray]]:
  """Length -> the decoder-only batch (numpy, `[num_samples, T]`, padded to
  the length's bucket; `positions` too when coupled or, `max_position` > 0,
  randomized) that `evaluate_models` scores every model on at that length
  (the seq2seq layout reads the same x): for measures of the data
  themselves (`ambiguity.ceiling`) and of a model's failures on them."""
  batch_size = min(batch_size, num_samples)
  num_batches = math.ceil(num_samples / batch_size)
  out = {}
  for bucket, bucket_lengths in buckets(sorted(lengths), train_max).items():
    program = _strings_program(task, bucket, batch_size, vocab_size, max_position, draw)
    for n in bucket_lengths:
      parts = [program(key, jnp.int32(n)) for key in evaluation_keys(eval_seed, n, num_batches)]
      out[n] = {k: np.concatenate([np.asarray(p[k]) for p in parts])
                for k in parts[0] if k != 'lengths'}
  return out


def evaluate_lengths(model: nnx.Module, task: tasks.DecoderTask, lengths: Iterable[int],
                     **kwargs) -> list[dict]:
  """Per length: `{'length', 'token_accuracy', 'exact_match'}` over
  `num_samples` sequences (evaluated `batch_size` at a time), plus
  `generated_exact_match` and `generation_agreement` with `generate`.
  `max_position` > 0 evaluates on randomized positions from [0, max_position).
  Keywords as `evaluate_models`."""
  return evaluate_models([model], task, lengths, **kwargs)[0]


def evaluate_models(trained: list[nnx.Module], task: tasks.DecoderTask, lengths: Iterable[int], *,
                    train_max: int, num_samples: int, vocab_size: int,
                    eval_seed: int = 12345, batch_size: int = 256,
                    max_position: int = 0, draw: str = 'per_example',
                    generate: bool = False,
                    clock: Optional[Stopwatch] = None) -> list[list[dict]]:
  """`evaluate_lengths`' rows for each of several models of one
  architecture (e.g. the seeds of one setup), all on the same sequences:
  their states stacked and the evaluation `jax.vmap`-ed over them, one
  program per bucket for all of them. `clock`: its stages 'evaluation' and
  'generation' get the time of each."""
  clock = clock or Stopwatch()
  stacked = len(trained) > 1
  splits = [nnx.split(m) for m in trained]
  graphdef = splits[0][0]
  state = (jax.tree.map(lambda *xs: jnp.stack(xs), *(s for _, s in splits)) if stacked
           else splits[0][1])
  rows = [[] for _ in trained]
  batch_size = min(batch_size, num_samples)
  num_batches = math.ceil(num_samples / batch_size)
  per_model = (lambda r, i: r[i]) if stacked else (lambda r, i: r)
  for bucket, bucket_lengths in buckets(sorted(lengths), train_max).items():
    program = functools.partial(evaluation_program, graphdef=graphdef, task=task,
                                bucket=bucket, num_samples=batch_size,
                                vocab_size=vocab_size, max_position=max_position, draw=draw,
                                stacked=stacked)
    forced_program, generation_program = program(), program(generate=True) if generate else None
    for n in bucket_lengths:
      raise_if_stopped()  # a stop request during evaluation, between lengths
      keys = evaluation_keys(eval_seed, n, num_batches)
      with clock.stage('evaluation'):
        results = jax.device_get([forced_program(state, key, jnp.int32(n)) for key in keys])
      if generate:
        with clock.stage('generation'):
          generated = jax.device_get([generation_program(state, key, jnp.int32(n)) for key in keys])
      for i, model_rows in enumerate(rows):
        # Every batch has the same number of sequences and of output tokens.
        row = dict(length=n, **{k: float(np.mean([per_model(r[k], i) for r in results]))
                                for k in ('token_accuracy', 'exact_match')})
        if generate:
          teacher = np.concatenate([per_model(r['exact'], i) for r in results])
          greedy = np.concatenate([per_model(r['exact'], i) for r in generated])
          row.update(generated_exact_match=float(np.mean(greedy)),
                     generation_agreement=float(np.mean(greedy == teacher)))
        model_rows.append(row)
  return rows
