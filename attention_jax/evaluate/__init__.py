"""Evaluation: accuracy per length with bucketed compilation."""

from attention_jax.evaluate.lengths import buckets
from attention_jax.evaluate.lengths import default_eval_lengths
from attention_jax.evaluate.lengths import evaluate_lengths
from attention_jax.evaluate.alignment import seq2seq_alignment
from attention_jax.evaluate.context_extension import rope_scaled
from attention_jax.evaluate.diagnostics import attention_entropy
from attention_jax.evaluate.diagnostics import attention_weights
from attention_jax.evaluate.diagnostics import copy_examples
from attention_jax.evaluate.diagnostics import entropy_by_position
