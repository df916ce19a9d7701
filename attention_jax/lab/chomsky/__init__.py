"""DeepMind's length-generalization benchmark under its own protocol: a
bidirectional encoder writing every output at once (Delétang et al. 2023;
Ruoss et al. 2023). `layout`: batches and randomized positions; `protocol`:
loss, accuracy, scores; `trainer`: one setting, seeds vmapped; `suite`: a
config's settings in a workdir; `report`: tables and the figure;
`published`: the papers' numbers. The tasks: any of `lab.tasks.SPECS`
(DeepMind's 15 in `lab.tasks.chomsky`, and copy, reverse, duplicate).
"""
