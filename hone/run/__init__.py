"""What every run shares, whatever it trains (language-model RL, SFT/DPO/RM, control, offline, teams): the
process's seed and threads, the run directory (created only once set-up has passed), the metrics log,
the wall-clock budget, signals and the one-line errors of set-up and of an interrupted run.

Imports: the leaves (`config`, `tracking`, `signals`, `errors`) and `training`'s checkpoints; never a
family's own package (`rl`, `control`, `preference`)."""
