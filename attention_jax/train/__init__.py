"""Training: optimizer, the compiled step, the loop."""

from attention_jax.train.loop import MODEL_KINDS
from attention_jax.train.loop import build_model
from attention_jax.train.loop import model_max_length
from attention_jax.train.loop import train
from attention_jax.train.optimizer import make_optimizer
from attention_jax.train.step import compiled_step
from attention_jax.train.step import step_function
from attention_jax.train.step import masked_metrics
from attention_jax.train.step import prediction_metrics
from attention_jax.train.step import train_step
