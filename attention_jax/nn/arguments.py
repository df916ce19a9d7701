"""How `MultiHeadAttention` reads its arguments, written our way or Flax's:
the width (`d_model` or `in_features`), the call's inputs (`x`/`context` or
`inputs_q`/`inputs_k`/`inputs_v`, `is_causal`) and dropout's
`deterministic` flags (Flax's precedence)."""

CAUSAL = ('MultiHeadAttention needs causal=: pass causal=True (decoder: query i sees keys '
          'j <= i) or causal=False (encoder / cross-attention, as flax.nnx.MultiHeadAttention '
          'computes without a mask).')
ORDER = ('the positional order is the lesson\'s, MultiHeadAttention(d_model, num_heads); '
         'flax.nnx.MultiHeadAttention\'s is (num_heads, in_features): write that one with '
         'keywords, MultiHeadAttention(num_heads=..., in_features=...)')


def model_width(d_model, in_features):
  """The module's width from `d_model` (ours) or `in_features` (Flax's)."""
  if d_model is not None and in_features is not None:
    raise ValueError(f'd_model={d_model} and in_features={in_features} name the same width: '
                     'give one (d_model positionally, or in_features= as in Flax).')
  width = in_features if d_model is None else d_model
  if width is None:
    raise ValueError('MultiHeadAttention needs its width: d_model (positional) or '
                     f'in_features=; {ORDER}.')
  return width


def call_inputs(x, context, inputs_q, inputs_k, inputs_v, is_causal, causal: bool):
  """(x, context) of a call written our way or Flax's: `inputs_q` is `x`,
  `inputs_k` is `context`, `inputs_v` may only be the keys' input itself;
  keys' input that is `x` itself (the same array) is self-attention, context
  None. `is_causal` must agree with the module's `causal`."""
  for ours, flax_name, a, b in (('x', 'inputs_q', x, inputs_q),
                                ('context', 'inputs_k', context, inputs_k)):
    if a is not None and b is not None:
      raise ValueError(f'{ours} and {flax_name}= name the same input (ours and Flax\'s name): '
                       'give one of them.')
  x = inputs_q if x is None else x
  context = inputs_k if context is None else context
  if x is None:
    raise ValueError('MultiHeadAttention needs the queries\' input: x (positional) or '
                     'inputs_q= (Flax\'s name).')
  keys_input = x if context is None else context
  if inputs_v is not None and inputs_v is not keys_input:
    raise ValueError('inputs_v must be the keys\' input itself (context, Flax\'s inputs_k; '
                     'default x): the values come from it, there is no separate value input.')
  if is_causal is not None and bool(is_causal) != causal:
    raise ValueError(f'is_causal={is_causal} but this module has causal={causal}: causality is '
                     'set at construction (it also picks the encoding\'s bias); build it with '
                     f'causal={bool(is_causal)}.')
  return x, None if context is x else context


def resolve_deterministic(rate: float, *flags) -> bool:
  """The first of `flags` that is not None (call, then module), Flax's rule;
  with rate 0 dropout is off whatever they say."""
  if rate == 0.0:
    return True
  for flag in flags:
    if flag is not None:
      return bool(flag)
  raise ValueError(f'dropout_rate={rate} needs to know whether to drop: pass '
                   'deterministic=True/False to the constructor or the call, or set it '
                   'on the whole model with model.train() / model.eval().')
