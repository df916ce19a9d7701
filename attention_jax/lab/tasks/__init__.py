"""Synthetic tasks: copy, reverse, duplicate; batches made on device."""

from attention_jax.lab.tasks.copy import BOS, EOS, NUM_SPECIAL, PAD, SEP
from attention_jax.lab.tasks.copy import LAYOUTS
from attention_jax.lab.tasks.copy import TASKS
from attention_jax.lab.tasks.copy import Task
from attention_jax.lab.tasks.copy import get_task
from attention_jax.lab.tasks.copy import make_batch
from attention_jax.lab.tasks.copy import make_seq2seq_batch
from attention_jax.lab.tasks.copy import sample_lengths
from attention_jax.lab.tasks.copy import sequence_length
from attention_jax.lab.tasks.copy import tokens_read
from attention_jax.lab.tasks.copy import train_batch
from attention_jax.lab.tasks.copy import with_random_positions
from attention_jax.lab.tasks import coupling
from attention_jax.lab.tasks import packing
