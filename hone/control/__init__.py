"""Classic control and robotics on Hone's algorithm core: gymnasium vector environments, policy networks,
replay, datasets and evaluation; `algos/` (the learners) and `loops/` (the runs that drive them).

Imports: `run`, `training`'s optimizer pieces, `algorithms` and the leaves; never `rl` (a CartPole run
loads no language-model code)."""
