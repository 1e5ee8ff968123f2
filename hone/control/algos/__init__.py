"""Control algorithms as CleanRL would write them: PPO's collect and update (`ppo`), the offline learners
(`offline`)."""
