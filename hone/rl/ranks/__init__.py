"""N learner ranks (`trainer.world_size`, torchrun or Ray): `launch` starts and watches the rank
processes, `learners` is what rank 0 leads and the others follow (collectives, weight gathers), `ray`
places ranks 1..N-1 as Ray actors."""
