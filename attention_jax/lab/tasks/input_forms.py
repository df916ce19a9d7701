"""What a well-formed input of each task is, for inputs given by hand
(`DecoderTask.encode`, `trained.Trained.predict`): a string of in-vocabulary
symbols can still be no input the task has, and a model would answer it all
the same (an operator inside an operand, an empty operand, a stack bit after
the actions). Each rule takes the input symbols (a list of ints, already in
`[0, input_size)`) and returns what is wrong, naming the operand or the place
and what the task allows, or None; the generators' own draws all pass
(tests/lab/tasks/test_input_forms.py).

Tasks whose inputs are uniform strings (copy, reverse, duplicate, parity,
even_pairs, cycle_navigation, reverse_string, duplicate_string, odds_first,
bucket_sort, compute_sqrt) have no rule: every string of their symbols is an
input. A task registered by the user has none either.
"""

from typing import Callable, Optional

from attention_jax.lab.tasks.chomsky import binary
from attention_jax.lab.tasks.chomsky import expressions as ex
from attention_jax.lab.tasks.chomsky import strings

Rule = Callable[[list], Optional[str]]


def _binary_operands(x: list, op: str) -> Optional[str]:
  """`a OP b` (the operator symbol 2) past length 2, a bare number up to it."""
  at = [i for i, s in enumerate(x) if s == binary.OPERATOR]
  if len(x) <= 2:
    if at:
      return (f'an input of {len(x)} symbols is one number (bits 0/1, no operator), '
              f"but position {at[0]} holds the operator '{op}' (symbol {binary.OPERATOR})")
    return None
  if len(at) != 1:
    where = ', '.join(map(str, at)) if at else 'none'
    return (f"an input of {len(x)} symbols is 'a {op} b' with exactly one operator "
            f"'{op}' (symbol {binary.OPERATOR}); found {len(at)} (positions {where})")
  if at[0] == 0:
    return f"operand a (before '{op}') is empty; each operand has at least one bit"
  if at[0] == len(x) - 1:
    return f"operand b (after '{op}') is empty; each operand has at least one bit"
  return None


def _modular_arithmetic(x: list) -> Optional[str]:
  """Digits 0 … 4 at even places, operators + - * (5, 6, 7) at odd ones."""
  for i, s in enumerate(x):
    if i % 2 == 0 and not 0 <= s < ex.MODULUS:
      return (f'position {i} (operand {i // 2 + 1}) holds symbol {s}, not a digit 0 … '
              f'{ex.MODULUS - 1}; operands sit at even positions')
    if i % 2 == 1 and s not in (ex.ARITHMETIC_PLUS, ex.ARITHMETIC_MINUS, ex.ARITHMETIC_TIMES):
      return (f'position {i} holds symbol {s}, not an operator + - * (5, 6, 7); '
              'operators sit at odd positions')
  return None


class _Grammar:
  """The brackets grammar (`expressions` module docstring): E := d | -d |
  (d) | (-d) | (E op E), over a task's token ids; `unknown`: a symbol that
  may stand for one digit (solve_equation's x), counted in `unknowns`."""

  def __init__(self, x, ids, ops, unknown=None):
    self.x, self.ids, self.ops, self.unknown, self.unknowns = x, ids, ops, unknown, 0

  def _digit(self, i):
    if i < len(self.x) and self.x[i] == self.unknown:
      self.unknowns += 1
      return True
    return i < len(self.x) and 0 <= self.x[i] < ex.MODULUS

  def _is(self, i, token):
    return i < len(self.x) and self.x[i] == self.ids[token]

  def parse(self, i):
    """The end of the expression starting at i, or raises ValueError(place)."""
    if self._digit(i):
      return i + 1
    if self._is(i, ex.MINUS) and self._digit(i + 1):
      return i + 2
    if not self._is(i, ex.OPEN):
      raise ValueError(i)
    inner_start = i + 1
    j = self.parse(inner_start)
    if self._is(j, ex.CLOSE) and j - inner_start <= 2:  # (d) or (-d)
      return j + 1
    if not any(self._is(j, op) for op in self.ops):
      raise ValueError(j)
    j = self.parse(j + 1)
    if not self._is(j, ex.CLOSE):
      raise ValueError(j)
    return j + 1


def _expression(x, ids, ops, unknown=None) -> tuple[Optional[int], int]:
  """(the place where `x` stops being one expression or None, x's unknowns)."""
  grammar = _Grammar(x, ids, ops, unknown)
  try:
    end = grammar.parse(0)
  except ValueError as e:
    return int(e.args[0]), grammar.unknowns
  except RecursionError:
    return 0, grammar.unknowns
  return (None if end == len(x) else end), grammar.unknowns


def _brackets(x: list) -> Optional[str]:
  bad, _ = _expression(x, ex.BRACKETS_IDS, (ex.PLUS, ex.MINUS, ex.TIMES))
  if bad is not None:
    return (f'not an expression of the grammar d | -d | (d) | (-d) | (E op E) from '
            f'position {bad} (digits 0 … 4, + 5, - 6, * 7, ( 8, ) 9)')
  return None


def _equation(x: list) -> Optional[str]:
  if len(x) < 3:  # the task's inputs below length 3 are zeros (theirs)
    return None if not any(x) else f'an input of {len(x)} symbols is all 0 (the task has no other)'
  if x[-2] != ex.EQUALS or not 0 <= x[-1] < ex.MODULUS:
    return (f"an input ends with '=' (symbol {ex.EQUALS}) and the value, a digit 0 … "
            f'{ex.MODULUS - 1}; it ends with {x[-2:]}')
  bad, unknowns = _expression(x[:-2], ex.EQUATION_IDS, (ex.PLUS, ex.MINUS), ex.UNKNOWN)
  if bad is not None:
    return (f'the left side is not an expression of the grammar d | -d | (d) | (-d) | '
            f'(E op E) from position {bad} (digits 0 … 4 or x 9, + 5, - 6, ( 7, ) 8)')
  if unknowns != 1:
    return f'the left side has {unknowns} unknowns x (symbol {ex.UNKNOWN}); it has exactly one'
  return None


def _stack(x: list) -> Optional[str]:
  """Stack bits (0/1), at least one, then actions (POP, PUSH 0, PUSH 1)."""
  if x[0] >= 2:
    return (f'the stack (bits 0/1 before the actions) is empty: position 0 holds action '
            f'{x[0]}')
  actions = [i for i, s in enumerate(x) if s >= 2]
  late = [i for i in range(actions[0] + 1, len(x)) if x[i] < 2] if actions else []
  if late:
    return (f'position {late[0]} holds stack bit {x[late[0]]} after the first action '
            f'(position {actions[0]}); after the stack only actions {strings.POP} (pop), '
            f'{strings.PUSH_0} (push 0) and {strings.PUSH_1} (push 1) follow')
  return None


def _missing_duplicate(x: list) -> Optional[str]:
  """w w (bits) with one symbol hidden by the gap, the fill symbol last at
  odd lengths; length 1 is [1]."""
  n, gap, fill = len(x), strings.GAP, strings.FILL
  if n == 1:
    return None if x == [1] else f'an input of 1 symbol is [1] (the task has no other)'
  half = n // 2
  fills = [i for i, s in enumerate(x) if s == fill]
  if fills != ([n - 1] if n % 2 else []):
    return (f'the fill symbol {fill} ends an odd-length input and appears nowhere else; '
            f'found it at {fills or "no position"}')
  gaps = [i for i in range(2 * half) if x[i] == gap]
  if len(gaps) != 1:
    return f'exactly one symbol is hidden (the gap, symbol {gap}); found {len(gaps)}'
  for i in range(half):
    if gap not in (x[i], x[i + half]) and x[i] != x[i + half]:
      return (f'the two copies differ at positions {i} and {i + half} ({x[i]} and '
              f'{x[i + half]}); the input is one string twice')
  return None


RULES: dict[str, Rule] = {
    'binary_addition': lambda x: _binary_operands(x, '+'),
    'binary_multiplication': lambda x: _binary_operands(x, '*'),
    'modular_arithmetic': _modular_arithmetic,
    'modular_arithmetic_brackets': _brackets,
    'solve_equation': _equation,
    'stack_manipulation': _stack,
    'missing_duplicate_string': _missing_duplicate,
}


def check_input(task_name: str, x: list) -> None:
  """ValueError naming what is wrong with input symbols `x` (a non-empty
  list of in-range ints) of task `task_name`, if its rule refuses them."""
  rule = RULES.get(task_name)
  wrong = rule(x) if rule else None
  if wrong:
    raise ValueError(f'{task_name} input {x}: {wrong}.')
