"""N learner ranks (2 CPU processes, gloo): the RL update on 2 ranks equals the one-process update."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hone.config import AlgorithmConfig, CriticConfig, TrainerConfig
from hone.training.critic import CriticTrainer, ValueModel
from hone.training.distributed import Ranks, full_state_dict, init_ranks, load_sharded, save_sharded, shard
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer
from tests.helpers import make_batch

# Three RL updates, each 2 epochs x 2 mini-batches of 3 rows (a share of 2 and of 1 on two ranks: the
# second rank pads with a zero-weight micro-batch) of one row per micro-batch, ragged responses.
TRAINER = {"lr": 0.5, "micro_batch_size": 1, "mini_batches": 2, "ppo_epochs": 2, "grad_clip": 0.5}


def updated_weights(
    model_dir: Path, agg: str, ranks: Ranks, strategy: str
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """The policy's weights (the full state dict; {} off rank 0) and metrics after three RL updates."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(0)
    policy = Policy.from_pretrained(model_dir)
    batch = make_batch(policy)  # before sharding: every rank holds the same whole batch
    shard(policy.model, strategy, ranks)
    trainer = RLTrainer(
        policy,
        AlgorithmConfig(loss_agg=agg),
        TrainerConfig(**TRAINER),
        total_rl_steps=3,
        temperature=1.0,
        norm_len=8,
        ranks=ranks,
    )
    # SGD: the update is linear in the gradient, so this compares gradients. Adam's g/sqrt(v) turns float
    # noise on a gradient that is zero in exact arithmetic (a key projection's bias: softmax ignores a
    # shift) into steps of up to lr: with AdamW at lr 1e-2 the two runs differ by 1.6e-5 there (measured),
    # by 1.2e-7 everywhere with SGD.
    trainer.optimizer = torch.optim.SGD(policy.trainable_parameters())
    metrics = [trainer.update(batch, step) for step in range(3)]
    if ranks.world == 1:
        return {k: v.clone() for k, v in policy.model.state_dict().items()}, metrics
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # a collective: rank 0 gets it all
    return get_model_state_dict(policy.model, options=options), metrics


def start_critic(model_dir: Path) -> ValueModel:
    torch.manual_seed(0)
    critic = ValueModel.from_pretrained(model_dir, dtype="float32", device=torch.device("cpu"))
    torch.nn.init.normal_(critic.head.weight, std=0.1)  # a head that is not zero: the trunk trains at once
    return critic


def updated_critic(
    model_dir: Path, ranks: Ranks, strategy: str
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """PPO's critic (`CriticTrainer`) after three updates on `ranks`: its full state dict and metrics."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    batch = make_batch(Policy.from_pretrained(model_dir))
    critic = start_critic(model_dir)
    values = critic.values(batch.input_ids, batch.attention_mask, batch.loss_mask).detach()
    batch = replace(batch, values=values)
    shard(critic, strategy, ranks)
    settings = CriticConfig(lr=0.5, value_clip=0.2)
    trainer = CriticTrainer(critic, settings, TrainerConfig(**TRAINER), total_rl_steps=3, ranks=ranks)
    trainer.optimizer = torch.optim.SGD(trainer.stepper.params)  # as `updated_weights`
    metrics = [trainer.update(batch, step) for step in range(3)]
    if ranks.world == 1:
        return {k: v.clone() for k, v in critic.state_dict().items()}, metrics
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(critic, options=options), metrics


def policy_trainer(model_dir: Path, ranks: Ranks) -> tuple[Policy, RLTrainer]:
    torch.manual_seed(0)
    policy = Policy.from_pretrained(model_dir)
    shard(policy.model, "fsdp2", ranks)
    settings = TrainerConfig(lr=1e-3, micro_batch_size=2)
    return policy, RLTrainer(
        policy, AlgorithmConfig(), settings, total_rl_steps=2, temperature=1.0, norm_len=8, ranks=ranks
    )


def checkpointed(model_dir: Path, ranks: Ranks, directory: str) -> dict[str, dict[str, torch.Tensor]]:
    """On `ranks`: an update, a sharded checkpoint, a second update; then a fresh model and optimizer
    loaded from the checkpoint take the second update again. The full weights after each (rank 0)."""
    batch = make_batch(Policy.from_pretrained(model_dir))
    policy, trainer = policy_trainer(model_dir, ranks)
    trainer.update(batch, 0)
    saved = full_state_dict(policy.model, ranks)
    save_sharded(directory, policy.model, trainer.optimizer)
    trainer.update(batch, 1)
    straight = full_state_dict(policy.model, ranks)
    policy, trainer = policy_trainer(model_dir, ranks)
    load_sharded(directory, policy.model, trainer.optimizer)
    trainer.updates = 1  # what the checkpoint's trainer state would restore (the mini-batch seed)
    trainer.update(batch, 1)
    return {"saved": saved, "straight": straight, "resumed": full_state_dict(policy.model, ranks)}


def _rank(rank: int, world: int, model_dir: str, agg: str, strategy: str, rendezvous: str, out: str) -> None:
    torch.set_num_threads(1)
    ranks = Ranks(rank, world)
    init_ranks(ranks, timeout_s=60, init_method=f"file://{rendezvous}")
    try:
        if agg == "by_rows":  # each row scored as [its index, the rank that scored it]
            result = {
                rows: ranks.by_rows(
                    rows,
                    lambda idx, rows=rows: torch.stack(
                        [
                            (torch.arange(rows) if idx is None else idx).float(),
                            torch.full((len(idx),), float(rank)),
                        ],
                        dim=1,
                    ),
                )
                for rows in (5, 1)
            }
        elif agg == "checkpoint":
            result = checkpointed(Path(model_dir), ranks, str(Path(out).parent / "dcp"))
        elif agg == "critic":
            result = updated_critic(Path(model_dir), ranks, strategy)
        else:
            result = updated_weights(Path(model_dir), agg, ranks, strategy)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("strategy", "agg"), [("fsdp2", "token-mean"), ("ddp", "seq-mean-token-mean"), ("fsdp2", "critic")]
)
def test_two_ranks_update_as_one_process(
    tmp_path: Path, micro_model_dir: Path, strategy: str, agg: str
) -> None:
    out = tmp_path / "rank0.pt"
    args = (2, str(micro_model_dir), agg, strategy, str(tmp_path / "rendezvous"), str(out))
    mp.start_processes(_rank, args=args, nprocs=2, start_method="spawn", join=True)
    two, two_metrics = torch.load(out, weights_only=False)
    if agg == "critic":
        one, one_metrics = updated_critic(micro_model_dir, Ranks(), strategy)
        start = start_critic(micro_model_dir).state_dict()
    else:
        one, one_metrics = updated_weights(micro_model_dir, agg, Ranks(), strategy)
        start = Policy.from_pretrained(micro_model_dir).model.state_dict()
    assert any(not torch.equal(one[k], start[k]) for k in start)  # the updates moved the weights
    for key in start:
        torch.testing.assert_close(two[key], one[key], atol=1e-6, rtol=0)
    for a, b in zip(two_metrics, one_metrics, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_a_sharded_checkpoint_resumes_exactly_and_loads_into_one_process(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    out = tmp_path / "rank0.pt"
    args = (2, str(micro_model_dir), "checkpoint", "fsdp2", str(tmp_path / "rendezvous"), str(out))
    mp.start_processes(_rank, args=args, nprocs=2, start_method="spawn", join=True)
    two = torch.load(out, weights_only=False)
    for key, value in two["straight"].items():  # resumed on 2 ranks: bit-identical to never stopping
        assert torch.equal(two["resumed"][key], value), key
    policy, trainer = policy_trainer(micro_model_dir, Ranks())  # the 2-rank checkpoint in one process
    load_sharded(str(tmp_path / "dcp"), policy.model, trainer.optimizer)
    for key, value in policy.model.state_dict().items():
        assert torch.equal(value, two["saved"][key]), key
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and any(m.abs().sum() > 0 for m in moments)  # AdamW's state came back too


def test_each_rank_trains_its_share_and_pads_to_the_same_micro_batch_count() -> None:
    rows = torch.arange(5)
    shares = [Ranks(r, 2).micro_batches(rows, 2) for r in range(2)]
    assert [[(m.tolist(), pad) for m, pad in share] for share in shares] == [
        [([0, 1], False), ([2], False)],
        [([3, 4], False), ([0], True)],  # rank 1 pads with a row whose loss counts 0
    ]
    assert [(m.tolist(), pad) for m, pad in Ranks().micro_batches(rows, 2)] == [
        ([0, 1], False),
        ([2, 3], False),
        ([4], False),
    ]
    loss = torch.tensor(3.0)
    assert Ranks(1, 2).weigh(loss, True) == 0 and Ranks(1, 2).weigh(loss, False) == 6
    assert Ranks().weigh(loss, False) is loss  # one rank: the very tensor, so one process is unchanged


def test_each_rank_scores_its_share_of_a_no_grad_pass_and_the_parts_gather_in_order(tmp_path: Path) -> None:
    """`Ranks.by_rows`: 5 rows over 2 ranks are rows 0-2 from rank 0 and 3-4 from rank 1 (which scored a
    padding row too, dropped); 1 row is rank 0's, rank 1 scoring a filler only."""
    out = tmp_path / "rank0.pt"
    args = (2, "", "by_rows", "fsdp2", str(tmp_path / "rendezvous"), str(out))
    mp.start_processes(_rank, args=args, nprocs=2, start_method="spawn")
    result = torch.load(out)
    assert result[5].tolist() == [[0, 0], [1, 0], [2, 0], [3, 1], [4, 1]]
    assert result[1].tolist() == [[0, 0]]
