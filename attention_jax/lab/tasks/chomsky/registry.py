"""The 15 tasks by name, in the papers' order (`TASKS`); every task of the
lab, these among them, is in `lab.tasks.SPECS` (`lab.tasks.get_spec`)."""


from attention_jax.lab.tasks.chomsky import binary
from attention_jax.lab.tasks.chomsky import expressions
from attention_jax.lab.tasks.chomsky import regular
from attention_jax.lab.tasks.chomsky import strings
from attention_jax.lab.tasks.spec import LEVELS
from attention_jax.lab.tasks.spec import TaskSpec

# In the papers' order: by level, then as their tables list them.
_ORDER = ('even_pairs', 'modular_arithmetic', 'parity_check', 'cycle_navigation',
          'stack_manipulation', 'reverse_string', 'modular_arithmetic_brackets',
          'solve_equation', 'duplicate_string', 'missing_duplicate_string', 'odds_first',
          'binary_addition', 'binary_multiplication', 'compute_sqrt', 'bucket_sort')
_ALL = {**regular.TASKS, **strings.TASKS, **binary.TASKS, **expressions.TASKS}
TASKS = {name: _ALL[name] for name in _ORDER}


__all__ = ['TaskSpec', 'LEVELS', 'TASKS']
