"""Pure attention functions on arrays: no parameters, no positional logic."""

from attention_jax.attention.dense import MASK_VALUE
from attention_jax.attention.dense import dot_product_attention
from attention_jax.attention.dense import multi_head_attention
from attention_jax.attention.masks import attention_mask_from_tokens
from attention_jax.attention.masks import causal_mask
from attention_jax.attention.masks import combine_masks
from attention_jax.attention.masks import padding_mask
from attention_jax.attention.masks import sliding_window_mask
from attention_jax.attention.additive import additive_scores
from attention_jax.attention.additive import attend
from attention_jax.attention.additive import dot_scores
from attention_jax.attention.dense import masked_softmax
from attention_jax.attention.chunked import chunked_attention
from attention_jax.attention.dispatch import scaled_dot_product_attention
from attention_jax.attention.dispatch import select_implementation
