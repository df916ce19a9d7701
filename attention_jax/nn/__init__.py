"""Flax NNX modules built on the pure functions."""

from attention_jax.nn.attention import MultiHeadAttention
from attention_jax.nn.attention import SelfAttention
