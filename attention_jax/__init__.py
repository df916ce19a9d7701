"""attention_jax: attention and positional encodings in JAX/Flax NNX.

The public API is re-exported here and declared in `__all__`; nothing else
lives in this file. The lab (`attention_jax.lab`: training and studies) is
not imported.
"""

from attention_jax import attention
from attention_jax import nn
from attention_jax import positional
from attention_jax.attention import MASK_VALUE
from attention_jax.attention import DenseBias
from attention_jax.attention import DifferenceBias
from attention_jax.attention import LinearBias
from attention_jax.attention import NoBias
from attention_jax.attention import ScoreSpec
from attention_jax.attention import StickBreaking
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
from attention_jax.attention import relative_distance
from attention_jax.attention import scaled_dot_product_attention
from attention_jax.attention import segment_mask
from attention_jax.attention import segment_positions
from attention_jax.attention import sliding_window_mask
from attention_jax.attention import stick_breaking_attention
from attention_jax.attention import WindowBias
from attention_jax.nn import AdditiveAttention
from attention_jax.nn import MultiHeadAttention
from attention_jax.nn import Seq2Seq
from attention_jax.nn import SelfAttention
from attention_jax.nn import TransformerEncoder
from attention_jax.nn import TransformerLM
from attention_jax.nn import generate
from attention_jax.positional import ENCODINGS
from attention_jax.positional import PositionalEncoding
from attention_jax.positional import ScoreContext
from attention_jax.positional import make_encoding
from attention_jax.positional import parse_encoding_spec
from attention_jax.positional import register_encoding

__version__ = '0.1.0'

__all__ = [
    # Pure functions (attention_jax.attention).
    'MASK_VALUE', 'additive_scores', 'attend', 'attention_mask_from_tokens',
    'causal_mask', 'chunked_attention', 'combine_masks', 'dot_product_attention',
    'dot_scores', 'multi_head_attention', 'padding_mask', 'relative_distance',
    'scaled_dot_product_attention', 'segment_mask', 'segment_positions',
    'sliding_window_mask', 'stick_breaking_attention', 'StickBreaking',
    # What an encoding adds to the scores, and what it may read to do so.
    'DenseBias', 'DifferenceBias', 'LinearBias', 'NoBias', 'ScoreContext', 'ScoreSpec',
    'WindowBias',
    # Modules and generation (attention_jax.nn).
    'AdditiveAttention', 'MultiHeadAttention', 'Seq2Seq', 'SelfAttention',
    'TransformerEncoder', 'TransformerLM', 'generate',
    # Positional encodings (attention_jax.positional).
    'ENCODINGS', 'PositionalEncoding', 'make_encoding', 'parse_encoding_spec',
    'register_encoding',
    # Subpackages.
    'attention', 'nn', 'positional',
]
