"""`hone serve tinker`: programs written against the `tinker` SDK alone, run against the server (tiny model).

The server runs in this process (a thread for its HTTP side, one for its worker), the SDK's client in its
own thread and event loop, over real HTTP on a free port; one test starts `hone serve tinker` as a
subprocess and stops it with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from hone.tinker.server import TinkerServer  # noqa: E402

API_KEY = "tml-local"  # the SDK wants a `tml-` key; the server takes any
# A memorisation set: short prompts, each with one completion to learn (one token per character).
PAIRS = [("2+2=", "4"), ("cat:", "meow"), ("dog:", "woof"), ("red+blue=", "purple")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    run_dir = tmp_path_factory.mktemp("tinker")
    # One torch thread: the tiny model's steps are fastest so, and on a shared machine OpenMP's spinning
    # threads made a 0.05 s step take 1-4 s (`hone.run.lifecycle.busy_machine_advice`).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with TinkerServer(run_dir, base_models=["tiny"], port=0, device="cpu", preload=True) as srv:
            yield srv
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def service(server: TinkerServer) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success").result()


# The program under test: the SDK and numpy only.


def sft_datum(tokenizer: Any, prompt: str, completion: str) -> types.Datum:
    """Next-token prediction on `completion` (and its end) after `prompt`: weights 0 on the prompt."""
    p = tokenizer.encode(prompt, add_special_tokens=False)
    c = [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id]
    tokens = p + c
    weights = [0.0] * (len(p) - 1) + [1.0] * len(c)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def mean_nll(output: types.ForwardBackwardOutput, data: list[types.Datum]) -> float:
    logprobs = np.concatenate([o["logprobs"].to_numpy() for o in output.loss_fn_outputs])
    weights = np.concatenate([d.loss_fn_inputs["weights"].to_numpy() for d in data])
    return float(-(logprobs * weights).sum() / weights.sum())


def train(
    client: tinker.TrainingClient, data: list[types.Datum], steps: int, lr: float = 5e-3
) -> list[float]:
    losses = []
    for _ in range(steps):
        fwd_bwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(mean_nll(fwd_bwd.result(), data))
        optim.result()
    return losses


def greedy(sampler: tinker.SamplingClient, tokenizer: Any, prompt: str, max_tokens: int) -> str:
    tokens = tokenizer.encode(prompt, add_special_tokens=False)
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    result = sampler.sample(types.ModelInput.from_ints(tokens), 1, params).result()
    seq = result.sequences[0]
    assert len(seq.logprobs) == len(seq.tokens)
    return str(tokenizer.decode(seq.tokens, skip_special_tokens=True))


# The tests.


def test_health_and_capabilities(server: TinkerServer) -> None:
    with urllib.request.urlopen(f"{server.url}/api/v1/healthz") as response:
        assert response.read() == b'{"status": "ok"}'
    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    models = rest.get_server_capabilities().result().supported_models
    assert [m.model_name for m in models] == ["tiny"]


def test_supervised_memorisation_then_greedy_samples(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=16).result()
    info = client.get_info()
    assert (info.model_data.model_name, info.lora_rank, info.is_lora) == ("tiny", 16, True)
    tokenizer = client.get_tokenizer()  # loaded from the tokenizer_id get_info gave: a local directory
    data = [sft_datum(tokenizer, p, c) for p, c in PAIRS]
    losses = train(client, data, steps=40)
    assert losses[-1] < 0.1 * losses[0], losses
    sampler = client.save_weights_and_get_sampling_client().result()
    for prompt, completion in PAIRS:
        assert greedy(sampler, tokenizer, prompt, max_tokens=len(completion) + 3) == completion
    # The base model, sampled beside the trained adapter, has learnt nothing.
    base = service.create_sampling_client(base_model="tiny").result()
    assert [greedy(base, tokenizer, p, len(c) + 3) for p, c in PAIRS] != [c for _, c in PAIRS]


def test_save_state_load_round_trip(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=8).result()
    tokenizer = client.get_tokenizer()
    data = [sft_datum(tokenizer, p, c) for p, c in PAIRS]
    train(client, data, steps=3)
    path = client.save_state("after-3").result().path
    assert path == f"tinker://{client.model_id}/weights/after-3"
    loss = mean_nll(client.forward(data, "cross_entropy").result(), data)

    weights_only = service.create_training_client_from_state(path).result()
    assert mean_nll(weights_only.forward(data, "cross_entropy").result(), data) == loss
    # With the optimizer's state too, the next step is the one the original client takes.
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert train(resumed, data, steps=2) == train(client, data, steps=2)


def test_training_runs_and_checkpoints_are_listed(
    server: TinkerServer, service: tinker.ServiceClient
) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=4, train_mlp=False).result()
    state = client.save_state("listed").result().path
    sampler = client.save_weights_for_sampler("listed-sampler").result().path
    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    run = rest.get_training_run(client.model_id).result()
    assert (run.training_run_id, run.base_model, run.lora_rank) == (client.model_id, "tiny", 4)
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state
    assert run.last_sampler_checkpoint is not None and run.last_sampler_checkpoint.tinker_path == sampler
    assert rest.get_training_run_by_tinker_path(sampler).result().training_run_id == client.model_id
    listed = rest.list_checkpoints(client.model_id).result().checkpoints
    assert [(c.checkpoint_id, c.checkpoint_type, c.tinker_path) for c in listed] == [
        ("weights/listed", "training", state),
        ("sampler_weights/listed-sampler", "sampler", sampler),
    ]
    assert all(c.size_bytes and c.size_bytes > 0 for c in listed)
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.lora_rank, info.train_mlp, info.train_attn) == ("tiny", 4, False, True)
    runs = rest.list_training_runs(limit=100).result()
    assert client.model_id in [r.training_run_id for r in runs.training_runs]
    assert runs.cursor.total_count == len(runs.training_runs)
    first = rest.list_user_checkpoints(limit=1).result()  # newest first, across runs
    assert [c.tinker_path for c in first.checkpoints] == [sampler] and first.cursor is not None
    # A deleted checkpoint is gone from the listing and from loads; an unknown run is refused (a 400).
    rest.delete_checkpoint_from_tinker_path(state).result()
    assert [c.tinker_path for c in rest.list_checkpoints(client.model_id).result().checkpoints] == [sampler]
    with pytest.raises(tinker.BadRequestError, match="no checkpoint"):
        service.create_training_client_from_state(state).result()
    with pytest.raises(tinker.BadRequestError, match="no training run 'nope'"):
        rest.get_training_run("nope").result()


def test_checkpoint_loads_after_a_server_restart(server: TinkerServer, service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    tokenizer = client.get_tokenizer()
    data = [sft_datum(tokenizer, p, c) for p, c in PAIRS]
    train(client, data, steps=2)
    path = client.save_state("before-restart").result().path
    loss = mean_nll(client.forward(data, "cross_entropy").result(), data)
    with TinkerServer(server.run_dir, base_models=["tiny"], port=0, device="cpu") as restarted:
        other = tinker.ServiceClient(base_url=restarted.url, api_key=API_KEY)
        resumed = other.create_training_client_from_state_with_optimizer(path).result()
        assert mean_nll(resumed.forward(data, "cross_entropy").result(), data) == loss
        other.close("success").result()


def test_clients_keep_their_own_adapters(service: tinker.ServiceClient) -> None:
    first = service.create_lora_training_client(base_model="tiny", rank=4).result()
    second = service.create_lora_training_client(base_model="tiny", rank=8, train_unembed=False).result()
    tokenizer = first.get_tokenizer()
    data = [sft_datum(tokenizer, p, c) for p, c in PAIRS]
    train(first, data, steps=2)
    before = mean_nll(first.forward(data, "cross_entropy").result(), data)
    train(second, data, steps=5)  # steps on the other adapter
    assert mean_nll(first.forward(data, "cross_entropy").result(), data) == before


def test_sampling_params_and_prompt_logprobs(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    tokenizer = client.get_tokenizer()
    sampler = client.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("hello", add_special_tokens=False))
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop=[])
    result = sampler.sample(prompt, 3, params, include_prompt_logprobs=True).result()
    assert [(len(s.tokens), s.stop_reason) for s in result.sequences] == [(6, "length")] * 3
    assert result.prompt_logprobs[0] is None and all(x < 0 for x in result.prompt_logprobs[1:])
    again = sampler.sample(prompt, 3, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # same seed
    # A stop token ends a sample with it (the same seed draws the same tokens up to there).
    one = sampler.sample(prompt, 1, params).result().sequences[0].tokens
    stop_id = one[2]
    stop = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop=[stop_id])
    stopped = sampler.sample(prompt, 1, stop).result().sequences[0]
    assert stopped.tokens == one[: one.index(stop_id) + 1] and stopped.stop_reason == "stop"


def test_rl_losses_through_the_sdk(service: tinker.ServiceClient) -> None:
    """Each RL loss on data whose sampler log-probs are the model's own (ratio 1): ppo, gspo and
    importance_sampling all reduce to -sum(A), cispo to -sum(A log p), dro (no penalty at ratio 1) too."""
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    tokenizer = client.get_tokenizer()
    plain = [sft_datum(tokenizer, p, c) for p, c in PAIRS[:2]]
    own = [o["logprobs"].to_numpy() for o in client.forward(plain, "cross_entropy").result().loss_fn_outputs]
    data, advantages = [], []
    for datum, lp in zip(plain, own, strict=True):
        weights = datum.loss_fn_inputs["weights"].to_numpy()
        adv = weights * np.linspace(-1.0, 2.0, len(weights))
        data.append(
            types.Datum(
                model_input=datum.model_input,
                loss_fn_inputs={
                    "target_tokens": datum.loss_fn_inputs["target_tokens"],
                    "logprobs": lp,
                    "advantages": adv.astype(np.float32),
                    "sequence_ratio_mask": weights,
                },
            )
        )
        advantages.append(adv)
    minus_a = -sum(float(a.sum()) for a in advantages)
    minus_a_lp = -sum(float((a * lp).sum()) for a, lp in zip(advantages, own, strict=True))
    expected = {"importance_sampling": minus_a, "ppo": minus_a, "gspo": minus_a, "cispo": minus_a_lp}
    for loss, value in expected.items():
        out = client.forward(data, loss).result()  # type: ignore[arg-type]
        assert out.metrics["loss:sum"] == pytest.approx(value, rel=1e-5), loss
        elementwise = sum(float(o["elementwise_loss"].to_numpy().sum()) for o in out.loss_fn_outputs)
        assert elementwise == pytest.approx(value, rel=1e-5), loss
    dro = client.forward(data, "dro", loss_fn_config={"beta": 0.5}).result()
    assert dro.metrics["loss:sum"] == pytest.approx(minus_a_lp, rel=1e-5)
    # A tighter PPO clip reaches the loss once the policy has moved (ratios no longer 1).
    client.forward_backward(data, "ppo").result()
    client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    wide = client.forward(data, "ppo").result().metrics["loss:sum"]
    tight_config = {"clip_low_threshold": 0.999, "clip_high_threshold": 1.001}
    tight = client.forward(data, "ppo", loss_fn_config=tight_config).result().metrics["loss:sum"]
    assert tight != pytest.approx(wide, rel=1e-4)


def test_unserved_loss_is_one_line(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model="tiny", rank=4).result()
    tokenizer = client.get_tokenizer()
    data = [sft_datum(tokenizer, "a", "b")]
    with pytest.raises(tinker.RequestFailedError, match="loss_fn 'stable_reinforce' is not served"):
        client.forward_backward(data, "stable_reinforce").result()
    with pytest.raises(tinker.RequestFailedError, match=r"dro needs loss_fn_config\['beta'\]"):
        client.forward_backward(data, "dro").result()


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "hone.cli", "serve", "tinker", "model.path=tiny", "model.device=cpu"]
    argv += ["--port", "0", "--run-dir", str(tmp_path / "tinker")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")
        line = next((x for x in lines if x.startswith("hone: Tinker API on ")), "")  # after any advice
        assert line.startswith("hone: Tinker API on http://127.0.0.1:"), line
        url = line.split()[4]
        with urllib.request.urlopen(f"{url}/api/v1/healthz") as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"{line}{out}"
    assert "stopping the Tinker server" in out
