"""The preference commands: `hone pairs` (preference pairs labelled by a recipe's reward, `pairs`) and
`hone dpo` / `hone rm` (`commands`: DPO and reward-model training from a recipe, on N ranks too).

Imports: `run`, `rl` (the producer and evaluation) and everything below; never `control`."""
