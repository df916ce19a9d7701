"""Config fields renamed since a workdir may have been written: the older
name -> today's, which is the study's name for the concept. A workdir's
stored identity is read with today's names (`suite_config.check_workdir`),
and a flag with an older name says where the field went
(`command_line`)."""

# (group, key) -> (group, key).
RENAMED = {('train', 'min_length'): ('task', 'train_min_length'),
           ('train', 'max_length'): ('task', 'train_max_length'),
           ('model', 'noise_max_length'): ('positions', 'max_position')}
