"""Language-model RL: the driver (`loop`), its set-up (`start`, `components`, `warmstart`), the producer
that samples and scores a step's groups, the learner that turns them into an update, evaluation and the
step's report. `placement/` decides where producers run (inline, threads, Ray) and how weights reach
them; `ranks/` runs the learner on N processes.

Imports: `run` and everything below it (`training`, `rollout`, `rewards`, `envs`, `data`, `models`,
`algorithms`); never `control` or `preference`."""
