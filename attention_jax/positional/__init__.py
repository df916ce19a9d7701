"""Positional encodings: pure functions, one hook module each, and the registry.

Shapes of a bias, one convention:

* pure functions of positions alone (`alibi_bias`, `alibi_bias_at`,
  `kerple_log_bias`, `fire_bias`, `hard_alibi_bias`, `learned_window_bias`)
  return float32 `[H, T_q, T_k]` for positions `[T]`, `[B, H, T_q, T_k]` for
  positions `[B, T]`;
* every encoding's method returns rank 4: `attention_bias(q_positions,
  k_positions)`, where an encoding has one, float32 `[1|B, H, T_q, T_k]` (1
  for positions `[T]`) or None, and a `DenseBias` from `score_contribution` holds a
  `[1|B, H, T_q, T_k]` array, ready to add to scores `[B, H, T_q, T_k]`;
  `heads_rank4` turns the first form into the second (`dense_spec`, both).
* per-token arrays are in Flax's order, [batch, length, heads]: FoX's log
  gates and their cumulative sums `[B, T, H]`, a `DifferenceBias`'s values.
"""

from attention_jax.positional.abacus import Abacus
from attention_jax.positional.abacus import abacus_ids
from attention_jax.positional.alibi import ALiBi
from attention_jax.positional.alibi import alibi_bias
from attention_jax.positional.alibi import alibi_bias_at
from attention_jax.positional.alibi import alibi_slopes
from attention_jax.positional.angles import rotation_angles
from attention_jax.positional.base import NoPE
from attention_jax.positional.base import PositionalEncoding
from attention_jax.positional.base import ScoreContext
from attention_jax.positional.cope import CoPE
from attention_jax.positional.cope import cope_bias
from attention_jax.positional.cope import cope_positions
from attention_jax.positional.coupling import coupled_position_ids
from attention_jax.positional.dape import DAPE
from attention_jax.positional.dape import dape_bias
from attention_jax.positional.dape import dape_scores
from attention_jax.positional.fire import FIRE
from attention_jax.positional.fire import fire_bias
from attention_jax.positional.forgetting import FoX
from attention_jax.positional.forgetting import cumulative_log_gates
from attention_jax.positional.forgetting import forget_gate_bias
from attention_jax.positional.forgetting import log_forget_gates
from attention_jax.positional.hard_alibi import HardALiBi
from attention_jax.positional.hard_alibi import hard_alibi_bias
from attention_jax.positional.base import dense_spec
from attention_jax.positional.base import embedding_only
from attention_jax.positional.base import heads_rank4
from attention_jax.positional.learned import Learned
from attention_jax.positional.learned import learned_lookup
from attention_jax.positional.learned_window import LearnedWindow
from attention_jax.positional.learned_window import learned_window_bias
from attention_jax.positional.p_rope import PRoPE
from attention_jax.positional.p_rope import p_rope_frequencies
from attention_jax.positional.path import PaTH
from attention_jax.positional.path import PaTHFoX
from attention_jax.positional.registry import ENCODINGS
from attention_jax.positional.registry import make_encoding
from attention_jax.positional.registry import parse_encoding_spec
from attention_jax.positional.registry import register_encoding
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
from attention_jax.positional.xpos import XPos
from attention_jax.positional.xpos import apply_xpos
from attention_jax.positional.xpos import xpos_position_limit
