"""Whether a config's evaluation can run at all, estimated before anything
trains: a study trains every model first, so an evaluation range that cannot
fit would otherwise be found after the training, grinding or out of memory.

Two estimates, both deliberately rough (a factor of a few either way), both
refusing only what is far out of reach:

Both read the evaluation's size (lengths, samples, batch) and the model's
depth and d_model, the MLP taken as 4 × d_model: they judge the evaluation
range, and leave a model too large for any length to the out-of-memory
handling of `runtime.entry_point`.

* memory: one evaluation call holds `eval.batch_size` sequences of the
  longest evaluated length, a few activations of width 4 × d_model per token, and with `model.attention_implementation='dense'` one score
  matrix per head (the other implementations work in blocks); refused above
  the machine's memory (`physical_memory`);
* work: the forward FLOPs over every evaluated length × `eval.num_samples`
  (weights 2·params per token, attention 4·d_model per query-key pair);
  refused above `MAX_EVAL_FLOPS`.
"""

import os

import ml_collections

from attention_jax.lab import tasks
from attention_jax.lab.errors import ConfigError
from attention_jax.lab.evaluate.lengths import eval_lengths
from attention_jax.lab.models import task_of

# About a week at a sustained 1e12 FLOP/s (a CPU far above ours; a small
# fraction of an accelerator's peak): beyond it an evaluation is not a run.
MAX_EVAL_FLOPS = 6e17
LIVE_ACTIVATIONS = 8  # activations of one token alive at once in a forward (estimate)


def physical_memory() -> int:
  """The machine's memory in bytes (0 if the system does not say)."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return 0


def check(config: ml_collections.ConfigDict) -> None:
  """ConfigError naming eval.max_length (and the fields that set the size)
  when the evaluation cannot fit (module docstring)."""
  m, e = config.model, config.eval
  if config.model.kind != 'transformer':
    return
  task = task_of(config)
  longest = tasks.tokens_read(task, e.max_length)
  width = 4 * m.d_model  # the MLP's hidden width as a standard block has it
  memory = 4 * e.batch_size * longest * width * LIVE_ACTIVATIONS
  if m.get('attention_implementation') == 'dense':
    memory += 4 * e.batch_size * m.num_heads * longest * longest
  limit = physical_memory()
  if limit and memory > limit:
    raise ConfigError(
        f'invalid config: eval.max_length={e.max_length} on {config.task.name!r}: the model '
        f'reads {longest:,} tokens per sequence, and one evaluation call of eval.batch_size='
        f'{e.batch_size} needs about {memory / 2**30:,.0f} GiB, more than this machine\'s '
        f'{limit / 2**30:,.0f} GiB; lower eval.max_length or eval.batch_size.')
  params = m.num_layers * (4 * m.d_model ** 2 + 2 * m.d_model * width)
  flops = 0.0
  for n in eval_lengths(config):
    t = tasks.tokens_read(task, n)
    flops += e.num_samples * m.num_layers * (2 * params / m.num_layers * t + 4 * m.d_model * t * t)
  if flops > MAX_EVAL_FLOPS:
    raise ConfigError(
        f'invalid config: eval.max_length={e.max_length} on {config.task.name!r}: evaluating '
        f'{len(eval_lengths(config))} lengths × eval.num_samples={e.num_samples} is about '
        f'{flops:.1e} FLOPs, above the limit of {MAX_EVAL_FLOPS:.0e} (about a week at 1e12 '
        'FLOP/s); lower eval.max_length, eval.lengths or eval.num_samples.')
