"""Evaluation: accuracy per length with bucketed compilation."""

from attention_jax.lab.config.eval_lengths import bucket_floor
from attention_jax.lab.evaluate.lengths import buckets
from attention_jax.lab.config.eval_lengths import default_eval_lengths
from attention_jax.lab.config.eval_lengths import eval_lengths
from attention_jax.lab.evaluate.lengths import evaluate_lengths
from attention_jax.lab.evaluate.lengths import evaluate_models
from attention_jax.lab.evaluate.alignment import seq2seq_alignment
from attention_jax.lab.evaluate.context_extension import rope_scaled
from attention_jax.lab.evaluate.diagnostics import attention_entropy
from attention_jax.lab.evaluate.diagnostics import attention_weights
from attention_jax.lab.evaluate.diagnostics import copy_examples
from attention_jax.lab.evaluate.diagnostics import entropy_by_position
from attention_jax.lab.evaluate.diagnostics import failure_rows
