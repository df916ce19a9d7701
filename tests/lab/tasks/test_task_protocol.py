"""Every registered decoder-protocol task offers the members of
`tasks.protocol.Task`, with the protocol's parameter names: a task that
drifts from the interface fails here, not deep inside a study."""

import inspect

from absl.testing import absltest
from absl.testing import parameterized

from attention_jax.lab import tasks
from attention_jax.lab.tasks.protocol import Task

# The protocol's methods, as `register_task` names what a task lacks.
METHODS = [name for name in tasks.protocol_members() if callable(getattr(Task, name, None))]


def _parameters(function):
  return [p for p in inspect.signature(function).parameters.values() if p.name != 'self']


class TaskProtocolTest(parameterized.TestCase):

  @parameterized.named_parameters((name, name) for name in sorted(tasks.TASKS))
  def test_task_protocol_every_registered_task_offers_it(self, name):
    task = tasks.TASKS[name]
    self.assertIsInstance(task, Task)
    for method in METHODS:
      got = [p.name for p in _parameters(getattr(task, method))]
      want = [p.name for p in _parameters(getattr(Task, method))]
      if method == 'encode':  # the raw inputs are the task's own, then the protocol's
        self.assertGreater(len(got), 2, f'{name}.encode takes no raw input')
        got = got[-2:]
        want = want[-2:]
      self.assertEqual(got, want, f'{name}.{method}')

  def test_task_protocol_names_every_member_the_lab_reads(self):
    # The docstring of tasks/ lists the members a task must have; the
    # protocol is that list, and a task missing one is not a Task.
    class Partial:
      name, pack = 'partial', 1
    self.assertNotIsInstance(Partial(), Task)
    self.assertIn('example', METHODS)
    self.assertIn('coupled_positions', METHODS)
    self.assertEqual(tasks.protocol_members()[:2], ['name', 'pack'])  # fields, then methods


if __name__ == '__main__':
  absltest.main()
