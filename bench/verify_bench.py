"""What verified weights cost (issue 34: < 2% of step time at the defaults).

1. The demo's workload (tiny model, 32 prompts x 8 samples x 8 tokens, fp32, sync), 30 RL steps after a
   short SFT, verification on (the default): the seconds spent verifying loads (`LocalWeightChannel
   .verify_s`: the engine's fingerprint plus the learner's, compared) against the steps' own time, both
   measured in this run. The log-prob canary adds nothing: it reads a pass the update makes anyway.
2. A SmolLM2-135M-shaped Qwen2 (random weights, fp32, tied head, 135 M parameters): one verification
   (both fingerprints of every tensor) against the copy a publish makes of the same tensors, in this run;
   and against that model's RL step time (bench/README.md, `vs_trl.py`: 22.6 s/step), from another run.

    .venv/bin/python bench/verify_bench.py    # ~3 min on 2 cores; writes bench/results/verify.json
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hone.config import load_config
from hone.rl.loop import train
from hone.rl.placement import weights as weights_module
from hone.rollout.fingerprint import expected_for, fingerprint

RESULTS = Path(__file__).parent / "results" / "verify.json"
SMOLLM2_STEP_S = 22.6  # bench/README.md, vs_trl.py on this machine (fp32)


def demo_overhead(root: Path) -> dict[str, float]:
    channels: list[weights_module.LocalWeightChannel] = []
    real_init = weights_module.LocalWeightChannel.__init__

    def recording_init(self: weights_module.LocalWeightChannel, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        channels.append(self)

    weights_module.LocalWeightChannel.__init__ = recording_init  # type: ignore[method-assign]
    overrides = [
        f"run.dir={root}",
        "run.name=verify",
        "run.steps=30",
        "run.time_limit_s=null",
        "run.eval_every=0",
        "run.save_every=0",
        "run.threads=2",
        "sft.max_steps=100",
        "eval.size=50",
        "algorithm.skip_zero_variance_groups=false",
        "logging.progress=false",
        "logging.plot=[]",
    ]
    train(load_config(None, overrides))
    rows = [json.loads(line) for line in (root / "verify" / "metrics.jsonl").read_text().splitlines()]
    step_s = sum(r.get("time/step_s", 0.0) for r in rows)
    verify_s = sum(c.verify_s for c in channels)
    publishes = sum(1 for r in rows if "time/publish_s" in r)
    return {"steps_s": step_s, "verify_s": verify_s, "publishes": publishes, "overhead": verify_s / step_s}


def smollm2_shaped() -> dict[str, float]:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    engine = copy.deepcopy(model)
    published = {name: p.detach() for name, p in model.named_parameters()}
    own = engine.state_dict()
    started = time.perf_counter()
    with torch.no_grad():
        for name, tensor in published.items():
            own[name].copy_(tensor)
    copy_s = time.perf_counter() - started
    started = time.perf_counter()
    held = fingerprint({name: own[name] for name in published})
    assert expected_for(published, held) == held
    verify_s = time.perf_counter() - started
    parameters = sum(t.numel() for t in published.values())
    return {
        "parameters": parameters,
        "copy_s": copy_s,
        "verify_s": verify_s,
        "verify_over_copy": verify_s / copy_s,
        "overhead_of_step": verify_s / SMOLLM2_STEP_S,
    }


def main() -> None:
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as root:
        demo = demo_overhead(Path(root))
    big = smollm2_shaped()
    print(
        f"demo (tiny, sync, fp32): {demo['publishes']:.0f} verified publishes, {demo['verify_s']:.3f} s of "
        f"{demo['steps_s']:.1f} s of steps = {100 * demo['overhead']:.2f}%"
    )
    print(
        f"SmolLM2-135M-shaped ({big['parameters'] / 1e6:.0f} M params, fp32): "
        f"verify {big['verify_s']:.3f} s, the publish's copy {big['copy_s']:.3f} s; "
        f"{100 * big['overhead_of_step']:.2f}% of a 22.6 s step"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"demo": demo, "smollm2_shaped": big}, indent=2) + "\n")


if __name__ == "__main__":
    main()
