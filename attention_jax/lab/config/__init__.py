"""How a run is asked for and checked, before anything is built.

`presets` finds a `--config` preset (packaged or a path), `preset_arguments`
parses its `:key=value` arguments, `command_line` reads and checks the flags,
`entries` turns a study entry (BASE[:PART…], or a named variant) into the
config of its runs, `validate` refuses a bad config early, naming the field
(`field_checks` on the fields, `run_checks` on each run's record),
`encoding_probe` asks an encoding what it serves, and `identity` says
which fields make a run what it is (a workdir holds one config's runs);
`suite_config` is all of that for DeepMind's suite, and `renamed` maps the
fields renamed since a workdir was written to today's.
`facts` derives what a config implies, one fact per function, and
`resolved` turns one run's validated config into the frozen record every
later stage reads (its task object, position ranges, the lengths
`eval_lengths` lists, model arguments), derived once.
"""
