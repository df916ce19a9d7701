"""Positional encodings: pure functions, one hook module each, and the registry."""

from attention_jax.positional.alibi import ALiBi
from attention_jax.positional.alibi import alibi_bias
from attention_jax.positional.alibi import alibi_bias_at
from attention_jax.positional.alibi import alibi_slopes
from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import NoPE
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.learned import Learned
from attention_jax.positional.learned import learned_lookup
from attention_jax.positional.registry import ENCODINGS
from attention_jax.positional.registry import make_encoding
from attention_jax.positional.registry import parse_encoding_spec
from attention_jax.positional.kerple import KERPLE
from attention_jax.positional.kerple import kerple_log_bias
from attention_jax.positional.randomized import random_positions
from attention_jax.positional.rope import RopeScaling
from attention_jax.positional.rope import scaled_rope_frequencies
from attention_jax.positional.t5 import T5RelativeBias
from attention_jax.positional.t5 import relative_position_bucket
from attention_jax.positional.rope import RoPE
from attention_jax.positional.rope import apply_rope
from attention_jax.positional.rope import rope_frequencies
from attention_jax.positional.sinusoidal import Sinusoidal
from attention_jax.positional.sinusoidal import sinusoidal
from attention_jax.positional.sinusoidal import sinusoidal_at
