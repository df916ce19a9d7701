"""Runs in a workdir: planning, training, evaluating and writing, safely.

`runner` runs every benchmark (its shards, locks, stop and time checks,
jobs side by side, outputs written once); its benchmarks are `study`, the
decoder study (each setup trained, evaluated and written by `one_run`,
which is also `experiments.train`'s one model), and `suite`, DeepMind's suite
under the encoder protocol. `plan` names the runs of a study config,
`one_study` keeps a workdir to one study,
`workdirs` and `workdir_checks` keep a workdir to one config, `locks` keeps
a run to one process, `cluster` deals a sweep into SLURM-array shards,
`run_files` reads a run's files, `timing` shares cores between setups,
`process` is the entry points' process (flags, exit codes, devices), and
`diagnose` the attention diagnostics of finished runs.
"""
