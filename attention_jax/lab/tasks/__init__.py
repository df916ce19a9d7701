"""Tasks, batches made on device. A task is inputs and outputs of any layout
and length (`spec.TaskSpec`): copy, reverse and duplicate (`copy.py`) and
DeepMind's 15 length-generalization tasks (`chomsky/`), all in `SPECS`. A
protocol lays a task out for a model: the causal decoder's `BOS x SEP y EOS`
(`decoder.DecoderTask`, batches in `batches.py`) and the bidirectional
encoder's `x BLANK…` (`lab.protocols.encoder_layout`); each serves every spec. Multi-digit
addition (`addition.py`: two operands of their own lengths, index hints,
Abacus digits) and flip-flop language modeling (`flipflop.py`: a 1-bit
register's instructions, its three distributions) are tasks of the decoder
protocol only.

`TASKS` maps a name to its decoder-protocol task. Training and evaluation
never ask which task they run: every task offers the members of
`protocol.Task` (a `typing.Protocol`: its name and options, its lengths and
layout, `example`, `encode` / `decode` for a finished run, and the coupled
position ids), and `tests/lab/tasks/test_task_protocol.py` checks each one.

A new task of the copy family is a rule and one `copy.TASKS` entry; any
other task is a `TaskSpec` (a generator `(key, length, B, N) -> (x, y)`)
and one entry in `SPECS`; a decoder-protocol task of its own layout is a
frozen dataclass with `protocol.Task`'s members and one entry in `TASKS`.
From outside the package: `register_task(spec_or_task)` in a module of
your own, named in `--config.imports`.
"""

from attention_jax.lab.tasks.batches import BOS

from attention_jax.lab.tasks.batches import EOS

from attention_jax.lab.tasks.batches import NUM_SPECIAL

from attention_jax.lab.tasks.batches import PAD

from attention_jax.lab.tasks.batches import SEP
from attention_jax.lab.tasks.batches import LAYOUTS
from attention_jax.lab.tasks.batches import make_batch
from attention_jax.lab.tasks.batches import make_seq2seq_batch
from attention_jax.lab.tasks.batches import sample_lengths
from attention_jax.lab.tasks.batches import sequence_length
from attention_jax.lab.tasks.batches import tokens_read
from attention_jax.lab.tasks.batches import train_batch
from attention_jax.lab.tasks.batches import with_random_positions
from attention_jax.lab.tasks.addition import Addition
from attention_jax.lab.tasks import addition
from attention_jax.lab.tasks import copy
from attention_jax.lab.tasks import coupling
from attention_jax.lab.tasks import flipflop
from attention_jax.lab.tasks import packing
from attention_jax.lab.tasks import packed_rows
from attention_jax.lab.tasks.decoder import DecoderTask
from attention_jax.lab.tasks.protocol import Task
from attention_jax.lab.tasks.protocol import protocol_members
from attention_jax.lab.tasks.spec import LEVELS
from attention_jax.lab.tasks.spec import TaskSpec
from attention_jax.lab.tasks.chomsky.registry import TASKS as CHOMSKY_TASKS

# Every task of the one kind, by name: both protocols serve each.
SPECS = {**copy.TASKS, **CHOMSKY_TASKS}
TASKS = {**{name: DecoderTask(spec) for name, spec in SPECS.items()}, 'addition': Addition(),
         **flipflop.TASKS}


def get_task(name: str):
  """The task registered as `name` (its default options); a ValueError
  lists the known ones."""
  if name not in TASKS:
    raise ValueError(f'unknown task {name!r}; choose one of {sorted(TASKS)}.')
  return TASKS[name]


def get_spec(name: str) -> TaskSpec:
  """The task `name` of the one kind (`SPECS`); a ValueError lists them."""
  if name not in SPECS:
    raise ValueError(f'unknown task {name!r}; choose one of {list(SPECS)}.')
  return SPECS[name]


def register_task(task) -> None:
  """Adds `task` under its name, so that every entry point takes the name
  (call it in a module named in `--config.imports`): a `TaskSpec` to
  `SPECS` and its decoder-protocol task to `TASKS` (both protocols serve
  it); any other `Task` (`protocol.Task`'s members: a task of its own
  layout, as addition is) to `TASKS`, for the decoder protocol. A
  ValueError names a taken name, a level not in `LEVELS`, or an object
  that is neither."""
  if not isinstance(task, (TaskSpec, Task)):
    missing = [m for m in protocol_members() if not hasattr(task, m)]
    raise ValueError(f'register_task takes a TaskSpec or a tasks.Task; {task!r} is neither'
                     + (f" (it lacks {', '.join(sorted(missing))})" if missing else '') + '.')
  if task.name in TASKS:
    raise ValueError(f'task {task.name!r} is registered already; choose another name.')
  if isinstance(task, TaskSpec):
    if task.level not in LEVELS:
      raise ValueError(f'task {task.name!r}: level={task.level!r}; choose one of {LEVELS}.')
    SPECS[task.name] = task
    task = DecoderTask(task)
  TASKS[task.name] = task
