"""Runs in a workdir: planning, training, evaluating and writing, safely.

`study` runs a decoder study (`one_study` one model), `suite` DeepMind's
suite under the encoder protocol; `plan` names the runs of a config,
`workdirs` and `workdir_checks` keep a workdir to one config, `locks` keeps
a run to one process, `cluster` deals a sweep into SLURM-array shards,
`run_files` reads a run's files, `timing` shares cores between setups,
`process` is the entry points' process (flags, exit codes, devices), and
`diagnose` the attention diagnostics of finished runs.
"""
