"""The lab: everything that trains and measures, built on the library.

Tasks (`tasks`), the config -> model factory and batch adapters (`models`),
training (`train`), evaluation (`evaluate`), the study (`study`), config
checks (`validate`), result files (`results`), figures (`plots`),
diagnostics (`diagnose`), the command line (`command_line`) and the process
around an experiment (`process`); a finished run for use (`trained`). The library
(`attention_jax.attention`, `.positional`, `.nn`) never imports from here.
"""
