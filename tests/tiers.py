"""Which cases of a parameterized sweep `make test` runs.

A sweep over kernels × dtypes × encodings checks one property many times;
most of its cost is compiling each case. `make test` keeps the first cases
of such a sweep (in the order its decorator lists them) and the slow tier
(`.ci/run`) runs the rest, so every case still runs on every change that
lands:

  @parameterized.product(kernel=tuple(KERNELS), dtype=DTYPES)
  @tiers.fast_cases(3)  # dense in every dtype; the other kernels in the slow tier
  def test_...(self, kernel, dtype):

tests/conftest.py reads the mark (`parameters`, `named_parameters` and
`product` alike).
"""


def fast_cases(count: int):
  """Marks a parameterized test: its cases 0 … count-1 stay in `make test`."""
  if not isinstance(count, int) or count < 1:
    raise ValueError(f'fast_cases takes a count >= 1, got {count!r}')

  def mark(test):
    test.fast_cases = count
    return test
  return mark
