"""Flax NNX modules built on the pure functions."""

from attention_jax.nn.additive import AdditiveAttention
from attention_jax.nn.attention import MultiHeadAttention
from attention_jax.nn.attention import SelfAttention
from attention_jax.nn.cache import check_cache
from attention_jax.nn.flax_params import from_flax
from attention_jax.nn.flax_params import to_flax
from attention_jax.nn.seq2seq import Seq2Seq
from attention_jax.nn.transformer import TransformerLM
from attention_jax.nn.encoder import TransformerEncoder
from attention_jax.nn.decoding import generate
from attention_jax.nn.sampling import process_logits
from attention_jax.nn.sampling import sample_tokens
from attention_jax.nn import sharding
