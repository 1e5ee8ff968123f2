"""Where a language-model run's producers run and how weights reach them: the one rollout source
(`source`) over an executor (`executors`: inline or threads; `ray/`: Ray actors), the staleness bound
(`staleness`) and weight channels (`weights`). `build` picks the executor a recipe asks for."""
