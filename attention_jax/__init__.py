"""attention_jax: attention and positional encodings in JAX/Flax NNX.

The public API is re-exported here; nothing else lives in this file.
"""

from attention_jax import positional
from attention_jax.attention import MASK_VALUE
from attention_jax.attention import additive_scores
from attention_jax.attention import attend
from attention_jax.attention import attention_mask_from_tokens
from attention_jax.attention import causal_mask
from attention_jax.attention import chunked_attention
from attention_jax.attention import combine_masks
from attention_jax.attention import dot_product_attention
from attention_jax.attention import dot_scores
from attention_jax.attention import multi_head_attention
from attention_jax.attention import padding_mask
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention import sliding_window_mask
from attention_jax.nn import AdditiveAttention
from attention_jax.nn import MultiHeadAttention
from attention_jax.nn import Seq2Seq
from attention_jax.nn import SelfAttention
from attention_jax.nn import TransformerLM
from attention_jax.positional import ENCODINGS
from attention_jax.positional import make_encoding

__version__ = '0.1.0'
