"""The RL update on N learner ranks (FSDP2 or DDP, gloo on CPU): memory per rank and time per update.

Each world size runs in its own N processes (`torch.multiprocessing`, a file rendezvous): a Qwen2 of
`--hidden` x `--layers` (byte tokenizer) is sharded (`hone.training.distributed.shard`), then `RLTrainer`
runs `--updates` RL updates with AdamW on one fixed batch (`--rows` x `--len` tokens, ragged responses).
Per rank it reports the bytes this rank holds of parameters, of gradients (as many as the trainable
parameters it holds: they are freed after each optimizer step) and of AdamW's state, and the median update
time after the first. The communication share at N ranks is 1 - (one rank's share of the batch updated
alone, in one process with that rank's threads) / (the update on N ranks): what the collectives and the
padding cost beyond the rank's own compute.

It then sizes real Qwen2 shapes (0.5B to 14B, built on the meta device: no memory) as FSDP2 shards them,
and reports per rank the bytes of parameters + gradients + AdamW's two moments in fp32 (16 bytes a
parameter at N = 1), and the largest that fits a per-rank budget (`--budget-gib`) at each N. Activations,
the reference and the sampler's copy are not counted. Run:

    .venv/bin/python bench/scaling_bench.py --worlds 1 2 --strategy fsdp2

On CPU ranks are for correctness and memory, not speed: two ranks share this machine's two cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hone.config import AlgorithmConfig, TrainerConfig
from hone.models.tiny import build_tiny_model
from hone.training.collate import collate
from hone.training.distributed import Ranks, init_ranks, shard
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer
from hone.types import Rollout, TrainBatch

# Qwen2/Qwen2.5 shapes: hidden, layers, intermediate, heads, kv heads, tied embeddings (vocab 151936).
QWEN2 = {
    "0.5B": (896, 24, 4864, 14, 2, True),
    "1.5B": (1536, 28, 8960, 12, 2, True),
    "3B": (2048, 36, 11008, 16, 2, True),
    "7B": (3584, 28, 18944, 28, 4, False),
    "14B": (5120, 48, 13824, 40, 8, False),
}


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor` this rank stores (its shard of a DTensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def fixed_batch(policy: Policy, rows: int, length: int) -> TrainBatch:
    generator = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    rollouts = []
    for i in range(rows):
        prompt = torch.randint(3, vocab, (length // 4,), generator=generator).tolist()
        response = torch.randint(
            3, vocab, (length // 2 + (i * 7) % (length // 2),), generator=generator
        ).tolist()
        rollouts.append(
            Rollout("s", i // 4, prompt + response, len(prompt), [1] * len(response), [0.0] * len(response))
        )
    seqs = collate(rollouts, pad_id=0)
    with torch.no_grad():
        old, _ = policy.token_log_probs(seqs.input_ids, seqs.attention_mask)
    advantages = torch.randn(rows, 1, generator=generator) * seqs.response_mask
    return TrainBatch(
        input_ids=seqs.input_ids,
        attention_mask=seqs.attention_mask,
        loss_mask=seqs.response_mask,
        behaviour_logp=old,
        old_logp=old,
        advantages=advantages,
        returns=advantages,
        group_ids=seqs.group_ids,
        prompt_lens=seqs.prompt_lens,
    )


def measure(ranks: Ranks, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    policy = Policy.from_pretrained(model_dir)
    batch = fixed_batch(policy, args.rows, args.len)
    shard(policy.model, args.strategy, ranks)
    trainer_cfg = TrainerConfig(lr=1e-5, micro_batch_size=args.micro, mini_batches=1)
    trainer = RLTrainer(
        policy,
        AlgorithmConfig(),
        trainer_cfg,
        total_rl_steps=args.updates,
        temperature=1.0,
        norm_len=args.len,
        ranks=ranks,
    )
    times = []
    for step in range(args.updates):
        if ranks.world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        trainer.update(batch, step)
        times.append(time.perf_counter() - t0)
    params = policy.trainable_parameters()
    state = trainer.optimizer.state
    return {
        "rank": ranks.rank,
        "params_bytes": sum(local_bytes(p) for p in policy.model.parameters()),
        "grads_bytes": sum(local_bytes(p) for p in params),
        "optimizer_bytes": sum(
            local_bytes(v) for s in state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
        ),
        "s_per_update": statistics.median(times[1:]) if len(times) > 1 else times[0],
    }


def learner_bytes(ranks: Ranks) -> dict[str, int]:
    """Per rank: fp32 parameters + gradients + AdamW's two moments (4 x the local parameter bytes) of each
    Qwen2 shape, sharded by FSDP2 on the meta device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sizes = {}
    for name, (hidden, layers, inter, heads, kv, tied) in QWEN2.items():
        config = Qwen2Config(
            vocab_size=151936,
            hidden_size=hidden,
            num_hidden_layers=layers,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            tie_word_embeddings=tied,
        )
        with torch.device("meta"):
            model = Qwen2ForCausalLM(config)
        shard(model, "fsdp2", ranks)
        sizes[name] = 4 * sum(local_bytes(p) for p in model.parameters())
    return sizes


def _rank(rank: int, world: int, model_dir: str, rendezvous: str, out: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(max(1, args.threads // world))
    ranks = Ranks(rank, world)
    init_ranks(ranks, timeout_s=300, init_method=f"file://{rendezvous}")
    try:
        mine = measure(ranks, Path(model_dir), args) | {"qwen2_bytes": learner_bytes(ranks)}
        everyone: list[Any] = [None] * world
        if world > 1:
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        if rank == 0:
            Path(out).write_text(json.dumps(everyone))
    finally:
        if world > 1:
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--strategy", choices=["fsdp2", "ddp"], default="fsdp2")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--len", type=int, default=64)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads shared by the ranks")
    parser.add_argument("--budget-gib", type=float, default=64.0, help="per-rank learner memory budget")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scaling_bench.json")
    args = parser.parse_args()
    results: dict[int, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model",
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.hidden // 64,
            head_dim=64,
        )
        for world in args.worlds:
            out = Path(tmp) / f"world{world}.json"
            mp.start_processes(
                _rank,
                args=(world, str(model_dir), str(Path(tmp) / f"rdzv{world}"), str(out), args),
                nprocs=world,
                start_method="spawn",
            )
            results[world] = json.loads(out.read_text())
        alone: dict[int, float] = {}  # one rank's share of the batch, updated in one process with its threads
        for world in args.worlds:
            if world == 1:
                continue
            share = argparse.Namespace(
                **{**vars(args), "rows": args.rows // world, "threads": args.threads // world}
            )
            out = Path(tmp) / f"alone{world}.json"
            mp.start_processes(
                _rank,
                args=(1, str(model_dir), str(Path(tmp) / f"rdzv-alone{world}"), str(out), share),
                nprocs=1,
                start_method="spawn",
            )
            alone[world] = json.loads(out.read_text())[0]["s_per_update"]
    one = results[min(results)][0]
    one_total = one["params_bytes"] + one["grads_bytes"] + one["optimizer_bytes"]
    print(
        f"{args.strategy}, Qwen2 hidden {args.hidden} x {args.layers} layers, {args.rows} x {args.len} tokens"
    )
    print("world  rank  params MB  grads MB  AdamW MB  total MB  / 1 rank  s/update")
    for world, ranks in results.items():
        for r in ranks:
            total = r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]
            mb = [r[key] / 2**20 for key in ("params_bytes", "grads_bytes", "optimizer_bytes")] + [
                total / 2**20
            ]
            print(
                f"{world:5d}  {r['rank']:4d}  {mb[0]:9.2f}  {mb[1]:8.2f}  {mb[2]:8.2f}  {mb[3]:8.2f}  "
                f"{total / one_total:8.3f}  {r['s_per_update']:8.3f}"
            )
    communication = {}
    for world, seconds in alone.items():
        step = max(r["s_per_update"] for r in results[world])
        communication[world] = 1 - seconds / step
        print(
            f"world {world}: one rank's share alone {seconds:.3f} s/update, on {world} ranks {step:.3f}: "
            f"communication and padding {100 * communication[world]:.0f}% of the update"
        )
    budget = args.budget_gib * 2**30
    largest = {}
    print(f"\nfp32 params + grads + AdamW per rank (GiB), FSDP2; budget {args.budget_gib:g} GiB per rank")
    print("world  " + "  ".join(f"{name:>6s}" for name in QWEN2) + "  largest that fits")
    for world, ranks in results.items():
        sizes = max((r["qwen2_bytes"] for r in ranks), key=lambda s: sum(s.values()))
        fits = [name for name in QWEN2 if sizes[name] <= budget]
        largest[world] = fits[-1] if fits else None
        gib = "  ".join(f"{sizes[name] / 2**30:6.1f}" for name in QWEN2)
        print(f"{world:5d}  {gib}  {largest[world]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "strategy": args.strategy,
        "hidden": args.hidden,
        "layers": args.layers,
        "results": results,
        "one_rank_share_alone_s": alone,
        "communication_share": communication,
        "budget_gib": args.budget_gib,
        "largest_fitting": largest,
    }
    args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
