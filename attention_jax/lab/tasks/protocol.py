"""What training, evaluation and prediction ask of a decoder-protocol task.

`DecoderTask(spec)` (every `TaskSpec`: copy, DeepMind's 15, …) and
`Addition` implement it; nothing in the lab asks which task it runs, only
these members. A new task of another shape (its own operands, its own
layout) is a frozen dataclass with them and one entry in `tasks.TASKS`;
`tests/lab/tasks/test_task_protocol.py` checks every registered task against this
class, names and parameters alike.

Shapes: B examples, T = `sequence_length(max_length)` tokens each; lengths
are int32 `[B]` (one length per example) or `[B, 2]` (addition's operands).
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class Task(Protocol):
  """The decoder protocol's task (module docstring)."""

  name: str
  pack: int  # examples per training sequence, seeing each other (`packing.py`)
  pack_segments: int  # > 0: packed rows of isolated examples (`packed_rows.py`)
  coupled_max_position: int  # > 0: coupled position ids, all below this
  abacus_max_k: int  # > 0: training batches carry an Abacus offset in [0, this]
  digit_tokens: tuple  # token ids Abacus embeddings count; () for none
  has_seq2seq: bool  # `batches.make_seq2seq_batch` lays it out for encoder-decoders
  ceiling: bool  # outputs copied from the input: the k-gram ceiling applies
  hard_set: str  # the kinds of its hard cases, for the reports; '' for none

  def configure(self, task_config) -> 'Task':
    """This task with the options of the config's `task` group; a ValueError
    names a bad value."""

  def for_training(self, task_config) -> 'Task':
    """This task as training draws it: the options of the config's `task`
    group that change only the training distribution (addition's
    `carry_mix`). The evaluation never calls it: it scores the task's own
    distribution. A ValueError names a bad value."""

  def num_symbols(self, vocab_size: int) -> int:
    """Token ids past the NUM_SPECIAL special ones."""

  def sequence_length(self, max_length: int) -> int:
    """Tokens of the longest example at `max_length`: the padded length T."""

  def max_number_length(self, max_length: int) -> int:
    """The longest run of symbols one position-id table must cover."""

  def fixed_lengths(self, n, batch_size: int):
    """The `lengths` of an evaluation at length n: `[B]` or `[B, 2]`."""

  def sample_lengths(self, key, batch_size: int, min_length: int, max_length: int):
    """Training lengths, uniform in [min_length, max_length]: `[B]` or `[B, 2]`."""

  def example(self, key, lengths, vocab_size: int, max_length: int):
    """`BOS input SEP output EOS PAD …` int32 `[B, T]`, and its output slots,
    bool `[B, T]`."""

  def encode(self, *inputs, vocab_size: int, key=None):
    """One example of raw inputs (the task's own: symbols for copy, two
    integers for addition), with placeholders in the output slots: tokens and
    output slots `[1, T]`, and its lengths."""

  def decode(self, output_tokens, vocab_size: int):
    """The raw output a decoder wrote before EOS, or None where its tokens
    are not an output of this task."""

  def coupled_positions(self, tokens, lengths, offset):
    """int32 `[B, T]` coupled position ids of `example`'s tokens."""

  def random_offsets(self, key, lengths, max_position: int):
    """Per-example offsets `[B]` of the coupled ids in training."""

  def check_max_position(self, max_position: int, max_length: int) -> None:
    """A ValueError where coupled ids up to `max_length` cannot stay below
    `max_position`."""

  def hard_cases(self, n, vocab_size: int) -> list:
    """Its hard evaluation set at length n: (case name, raw input) pairs, as
    `encode` takes the input (`hard_cases.py`); [] for none."""

  def with_inputs(self, inputs, vocab_size: int, max_length: int):
    """This task with its draw replaced by `hard_cases`' inputs, laid out
    at `max_length` (`hard_cases.Fixed`: `example` gives them, `lengths`
    what the batch functions take with them)."""


def protocol_members() -> list[str]:
  """`Task`'s members by name: its fields, then its methods."""
  methods = [name for name, member in vars(Task).items()
             if callable(member) and not name.startswith('_')]
  return list(Task.__annotations__) + methods
