"""The Ray back-end (`cluster.backend: ray`, the `ray` extra): the cluster session, the executor that hands
prompt shares to sampler actors, and the actors themselves (samplers, reward workers)."""
