"""How a model reads a task and is scored: one module per protocol.

* `decoder`: the causal decoder with generation (the copy study, addition,
  flip-flop): the adapters between the tasks' batch dicts and the
  library's models (teacher forcing, greedy generation with the key/value
  cache); its models are built from a run's record (`config.resolved`).
* `encoder` and `encoder_layout`: DeepMind's protocol (Delétang et al. 2023;
  Ruoss et al. 2023), a bidirectional encoder writing every output at once
  into blank slots: its loss, accuracy and scores, and its batches and
  randomized positions.
"""
