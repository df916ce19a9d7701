"""The input lengths a config evaluates, and the bucket floor they are
padded from: facts of the config alone (`config.resolved` records them per
run; `evaluate.lengths` pads and scores them)."""

from typing import Sequence


def default_eval_lengths(train_max: int, eval_max: int) -> list[int]:
  """Every length up to `train_max`, then 1.25x, 1.5x and a grid that doubles
  in two steps (2x, 3x, 4x, 6x, 8x, 12x, … train_max), up to and including
  `eval_max`: every checkpoint the study reports (1.25x, 2x, 4x, 8x), and
  few lengths per power of two, each costing an evaluation and a generation."""
  lengths = set(range(1, min(train_max, eval_max) + 1))
  multiples, power = [1.25, 1.5], 2
  while power * train_max < eval_max:
    multiples += [power, 1.5 * power]
    power *= 2
  lengths.update(min(eval_max, int(round(m * train_max))) for m in multiples)
  lengths.add(eval_max)
  return sorted(lengths)


def eval_lengths(config) -> list[int]:
  """The input lengths a config evaluates: `eval.lengths`, or () for
  `default_eval_lengths` of its training and evaluation maxima."""
  return sorted(config.eval.lengths) or default_eval_lengths(
      config.task.train_max_length, config.eval.max_length)


def bucket_floor(config, lengths: Sequence[int]) -> int:
  """The `train_max` that `buckets` gets for a config's `lengths`: the
  training maximum, or with `eval.one_bucket` the longest length, so every
  length shares one padded size and one compiled program (a tiny preset's
  time is its compiles; padding does not change a copy-family result,
  tests/lab/train/test_training.py, but it draws addition's operands anew)."""
  if config.eval.get('one_bucket', False):
    return max(lengths)
  return config.task.train_max_length
