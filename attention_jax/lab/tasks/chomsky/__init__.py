"""DeepMind's 15 length-generalization tasks (Delétang et al. 2023; Ruoss et
al. 2023), made on device from `(key, length)`, tasks of the one kind (`lab.tasks.spec.TaskSpec`):

  regular            even_pairs, modular_arithmetic, parity_check, cycle_navigation
  context_free       stack_manipulation, reverse_string,
                     modular_arithmetic_brackets, solve_equation
  context_sensitive  duplicate_string, missing_duplicate_string, odds_first,
                     binary_addition, binary_multiplication, compute_sqrt, bucket_sort

Each module follows the official `tasks/` code and `experiments/
constants.py` (its docstring names the files and the places where their
docstrings and code disagree); the tests compare each with a NumPy
transcription of theirs.

The registry: `registry.TASKS`, in the papers' order; by name with the
others: `lab.tasks.get_spec`.
"""
