"""The lab: everything that trains and measures, built on the library.

One folder per stage of a run, in the order a run meets them:

* `config`: presets, flags, study entries and the checks that refuse a bad
  config before anything is built;
* `tasks`: the tasks (copy, DeepMind's 15, addition, flip-flop), their
  batches and hard cases, one `Task` protocol;
* `protocols`: how a model reads a task and is scored (`decoder`: causal,
  with generation; `encoder`: DeepMind's blank output slots);
* `train`: the optimizer, the compiled step, the loop, checkpoints, meshes;
* `evaluate`: accuracy per length, the hard set, context extension,
  diagnostics;
* `runs`: a workdir's runs (the study, DeepMind's suite, locks, shards,
  resume);
* `report`: result tables and figures.

Two modules at the top are what a user imports: `trained` (a finished run
loaded for use, docs/api.md) and `errors` (the one exception a bad config
raises). The library
(`attention_jax.attention`, `.positional`, `.nn`) never imports from here.
"""
