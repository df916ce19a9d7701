"""Training: optimizer, the compiled step, the loop."""

from attention_jax.lab.train.loop import train
from attention_jax.lab.train.loop import train_seeds
from attention_jax.lab.train.optimizer import make_optimizer
from attention_jax.lab.train.step import step_function
from attention_jax.lab.train.step import train_step
