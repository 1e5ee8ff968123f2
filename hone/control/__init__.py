"""Classic control and robotics on Hone's algorithm core: gymnasium vector environments, actor-critic
policies, and rollout collection. The loop that drives them is `hone.orchestration.control_loop`."""
