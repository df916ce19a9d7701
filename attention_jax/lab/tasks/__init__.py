"""Synthetic tasks, batches made on device: copy, reverse, duplicate
(`copy.py`), multi-digit addition (`addition.py`) and DeepMind's 15
length-generalization tasks (`chomsky/`, laid out by `chomsky/decoder.py`).

Every task follows one protocol, so training and evaluation never ask which
task they run: a frozen dataclass with `name`, `pack`, `coupled_max_position`,
`digit_tokens` (what Abacus embeddings count; () for none), `has_seq2seq`, and

  configure(task_config) -> task   its options from the config's `task` group
  num_symbols(vocab_size) -> int   token ids past the NUM_SPECIAL special ones
  sequence_length(max_length)      tokens of the longest example, padded length
  max_number_length(max_length)    the longest run of symbols one id table covers
  fixed_lengths(n, batch_size)     the `lengths` of an evaluation at length n
  sample_lengths(key, B, lo, hi)   training lengths, `[B]` or `[B, 2]`
  example(key, lengths, vocab_size, max_length) -> (tokens, is_output)
                                   `BOS input SEP output EOS PAD …`, `[B, L]`
  coupled_positions(tokens, lengths, offset), random_offsets(key, lengths,
  max_position), check_max_position(max_position, max_length): coupling.
"""

from attention_jax.lab.tasks.copy import BOS, EOS, NUM_SPECIAL, PAD, SEP
from attention_jax.lab.tasks.copy import COPY_TASKS
from attention_jax.lab.tasks.copy import LAYOUTS
from attention_jax.lab.tasks.copy import Task
from attention_jax.lab.tasks.copy import make_batch
from attention_jax.lab.tasks.copy import make_seq2seq_batch
from attention_jax.lab.tasks.copy import sample_lengths
from attention_jax.lab.tasks.copy import sequence_length
from attention_jax.lab.tasks.copy import tokens_read
from attention_jax.lab.tasks.copy import train_batch
from attention_jax.lab.tasks.copy import with_random_positions
from attention_jax.lab.tasks.addition import Addition
from attention_jax.lab.tasks import addition
from attention_jax.lab.tasks import coupling
from attention_jax.lab.tasks import packing
from attention_jax.lab.tasks.chomsky.decoder import DecoderTask
from attention_jax.lab.tasks.chomsky.registry import TASKS as CHOMSKY_TASKS

# DeepMind's 15 tasks under this protocol too (`chomsky/decoder.py`); their
# own encoder protocol is `lab.chomsky`.
TASKS = {**COPY_TASKS, 'addition': Addition(),
         **{name: DecoderTask(spec) for name, spec in CHOMSKY_TASKS.items()}}


def get_task(name: str):
  """The task registered as `name` (its default options); a ValueError
  lists the known ones."""
  if name not in TASKS:
    raise ValueError(f'unknown task {name!r}; choose one of {sorted(TASKS)}.')
  return TASKS[name]
