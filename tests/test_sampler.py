"""HFSampler against transformers' own generation and a full forward pass on a tiny random model."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from hone.rollout import HFSampler, Sampler
from hone.rollout.base import GenerationInterrupted, Interruptible
from hone.rollout.engines.hf import sample_next
from hone.rollout.engines.token_sampling import draw
from hone.types import SamplingParams
from tests.conftest import char_tokenizer
from tests.helpers import (
    ATOL,
    CHARS,
    EOS,
    PAD,
    PROMPTS,
    full_forward_logprobs,
    greedy,
    make_model,
    next_turn,
    prefill_shapes,
    prefill_widths,
    requests,
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    tokenizer = char_tokenizer(CHARS, unk_token=None)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (PAD, EOS)
    return tokenizer


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return make_model(0)


@pytest.fixture()
def sampler(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase) -> HFSampler:
    return HFSampler(model, tokenizer)


def test_is_a_sampler(sampler: HFSampler) -> None:
    assert isinstance(sampler, Sampler)


@pytest.mark.parametrize("max_batch_size", [256, 2])
def test_greedy_matches_hf_generate_with_left_padding(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, max_batch_size: int
) -> None:
    reqs = requests(tokenizer)
    rollouts = HFSampler(model, tokenizer, max_batch_size=max_batch_size).generate(reqs, greedy())

    width = max(len(r.prompt_ids) for r in reqs)
    input_ids = torch.tensor([[PAD] * (width - len(r.prompt_ids)) + r.prompt_ids for r in reqs])
    mask = (input_ids != PAD).long()
    out = model.generate(
        input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=PAD
    )
    for rollout, row in zip(rollouts, out[:, width:].tolist(), strict=True):
        expected = row[: row.index(EOS) + 1] if EOS in row else row
        assert rollout.response_ids == expected
    # Both endings occur, so rows leaving the batch mid-decode are exercised too.
    assert {r.finish_reason for r in rollouts} == {"stop", "length"}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=3, temperature=0.8, top_p=0.9, top_k=12, max_new_tokens=10, seed=1),
        SamplingParams(n=2, temperature=1.3, max_new_tokens=10, seed=2),
        greedy(max_new_tokens=10),
    ],
)
def test_sampler_logprobs_match_a_full_forward_pass(
    sampler: HFSampler, model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, params: SamplingParams
) -> None:
    for rollout in sampler.generate(requests(tokenizer), params):
        recomputed = full_forward_logprobs(model, rollout, params.temperature)
        torch.testing.assert_close(
            torch.tensor(rollout.sampler_logprobs, dtype=torch.float64), recomputed, atol=ATOL, rtol=0
        )


def test_same_seed_same_output_other_seed_differs(
    sampler: HFSampler, tokenizer: PreTrainedTokenizerBase
) -> None:
    def run(seed: int) -> list[tuple[list[int], list[float]]]:
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=seed)
        return [(r.token_ids, r.sampler_logprobs) for r in sampler.generate(requests(tokenizer), params)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_stop_string_ends_response_and_is_included(
    sampler: HFSampler, tokenizer: PreTrainedTokenizerBase
) -> None:
    free = sampler.generate(requests(tokenizer), greedy())
    stop = free[0].response_text[4:6]
    stopped = sampler.generate(requests(tokenizer), greedy(stop=["never", stop]))
    for f, s in zip(free, stopped, strict=True):
        if stop in f.response_text:
            end = f.response_text.find(stop) + len(stop)
            assert s.finish_reason == "stop"
            assert s.response_text == f.response_text[:end]
            assert s.response_ids == f.response_ids[:end]  # char-level: one token per char
        else:  # rows that do not hit it are unaffected by the others leaving the batch
            assert (s.response_ids, s.finish_reason) == (f.response_ids, f.finish_reason)
    assert sum(stop in f.response_text for f in free) < len(free)


def test_stop_string_in_prompt_does_not_stop(sampler: HFSampler, tokenizer: PreTrainedTokenizerBase) -> None:
    (rollout,) = sampler.generate(requests(tokenizer, ["the quick brown"]), greedy(stop=["quick"]))
    assert rollout.finish_reason == "length"
    assert rollout.response_len == 12


def test_interrupt_ends_the_running_call_only(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`interrupt` (from another thread in a run; here from inside the 3rd forward pass) makes the running
    call raise after its current token; the next call samples in full."""
    sampler = HFSampler(model, tokenizer)
    assert isinstance(sampler, Interruptible)
    forwards = 0
    forward = model.forward

    def counting_forward(*args: object, **kwargs: object) -> object:
        nonlocal forwards
        forwards += 1
        if forwards == 3:
            sampler.interrupt()
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    with pytest.raises(GenerationInterrupted):
        sampler.generate(requests(tokenizer), greedy(max_new_tokens=50))
    assert forwards == 3  # stopped before the 4th forward pass, not at the 50-token budget
    monkeypatch.setattr(model, "forward", forward)
    rollouts = sampler.generate(requests(tokenizer), greedy(max_new_tokens=5))
    assert [r.response_len for r in rollouts if r.finish_reason == "length"] and all(
        r.response_len <= 5 for r in rollouts
    )


def test_max_new_tokens_and_finish_reason(sampler: HFSampler, tokenizer: PreTrainedTokenizerBase) -> None:
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=5, seed=0)
    rollouts = sampler.generate(requests(tokenizer), params)
    for r in rollouts:
        if r.finish_reason == "length":
            assert r.response_len == 5
            assert EOS not in r.response_ids
        else:
            assert r.finish_reason == "stop"
            assert r.response_ids.index(EOS) == r.response_len - 1  # eos is part of the response
            assert "<eos>" not in r.response_text
    assert {r.finish_reason for r in rollouts} == {"stop", "length"}


def test_each_request_stops_at_its_own_token_budget(
    sampler: HFSampler, tokenizer: PreTrainedTokenizerBase
) -> None:
    free = sampler.generate(requests(tokenizer), greedy(max_new_tokens=12))
    own = [1, 3, None, 12, 2]  # None: the params' 5; 12 is above the params' budget
    capped = sampler.generate(
        [replace(r, max_new_tokens=b) for r, b in zip(requests(tokenizer), own, strict=True)],
        greedy(max_new_tokens=5, n=2),
    )
    budgets = [5 if b is None else b for b in own]
    assert (
        sum(f.response_len > b for f, b in zip(free, budgets, strict=True)) >= 3
    )  # cut at different lengths
    for i, (f, budget) in enumerate(zip(free, budgets, strict=True)):
        for rollout in capped[2 * i : 2 * i + 2]:
            assert rollout.response_ids == f.response_ids[:budget]
            assert rollout.finish_reason == ("length" if f.response_len > budget else f.finish_reason)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sampler.generate([replace(requests(tokenizer)[0], max_new_tokens=0)], greedy())


def test_n_rollouts_per_request_grouped_in_request_order(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase
) -> None:
    sampler = HFSampler(model, tokenizer, max_batch_size=5)  # 12 rows -> chunks of whole groups: 4, 4, 4
    sampler.policy_version = 3
    reqs = requests(tokenizer)[:3]
    rollouts = sampler.generate(reqs, SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=0))
    assert len(rollouts) == 12
    for i, r in enumerate(rollouts):
        req = reqs[i // 4]
        assert (r.sample_id, r.group_id, r.policy_version) == (req.sample_id, req.group_id, 3)
        assert r.token_ids[: r.prompt_len] == req.prompt_ids
        assert len(r.sampler_logprobs) == r.response_len > 0
        assert r.loss_mask == [1] * r.response_len
        assert r.turns == [(0, r.response_len)]
        assert r.response_text == tokenizer.decode(r.response_ids, skip_special_tokens=True)
    # The n samples of a group are independent draws, not copies.
    assert len({tuple(r.response_ids) for r in rollouts[:4]}) > 1


def test_each_prompt_is_prefilled_once_per_chunk_and_its_copies_decode_alike(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampler = HFSampler(model, tokenizer, max_batch_size=7)  # n=3: chunks of 2 whole groups (6 rows)
    prefills = prefill_shapes(model, monkeypatch)
    reqs = requests(tokenizer)[:3]
    shared = sampler.generate(reqs, greedy(n=3))
    monkeypatch.undo()
    assert [rows for rows, _ in prefills] == [2, 1]  # distinct prompts, not 9 rows
    # greedy copies of a prompt equal that prompt generated on its own
    for i, req in enumerate(reqs):
        alone = HFSampler(model, tokenizer).generate([req], greedy())[0]
        assert [r.response_ids for r in shared[3 * i : 3 * i + 3]] == [alone.response_ids] * 3


def test_top_k_one_and_tiny_top_p_equal_greedy(
    sampler: HFSampler, tokenizer: PreTrainedTokenizerBase
) -> None:
    reference = sampler.generate(requests(tokenizer), greedy())
    for params in (
        SamplingParams(top_k=1, max_new_tokens=12, seed=0),
        SamplingParams(top_p=1e-6, max_new_tokens=12),
    ):
        rollouts = sampler.generate(requests(tokenizer), params)
        assert [r.token_ids for r in rollouts] == [r.token_ids for r in reference]
        # Log-probs are taken before truncation: at temperature 1 they are greedy's, not log(1) = 0.
        for r, g in zip(rollouts, reference, strict=True):
            assert r.sampler_logprobs == pytest.approx(g.sampler_logprobs, abs=1e-6)
            assert max(r.sampler_logprobs) < 0


def test_top_p_samples_only_from_the_nucleus() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(400, 4)
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_next(logits, SamplingParams(top_p=0.75), gen)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 is the smallest set holding 0.75
    torch.testing.assert_close(logprobs, logits[0].log_softmax(-1)[tokens])


def test_draw_follows_the_distribution_and_never_picks_a_zero() -> None:
    """Inverse-CDF draws: frequencies within 4 standard errors of each probability over 200k draws (a fixed
    seed: the bound holds for this stream, and a wrong sampler misses it by far), zero entries never drawn,
    rows independent of the probabilities' scale."""
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    rows = 200_000
    tokens = draw((probs * 7).expand(rows, 6), torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=6).double() / rows
    stderr = (probs.double() * (1 - probs.double()) / rows).sqrt()
    assert bool(((counts - probs.double()).abs() <= 4 * stderr + 1e-12).all()), counts
    assert counts[1] == 0 and counts[5] == 0


def test_draw_moves_a_uniform_rounded_to_the_total_off_a_zero_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A uniform equal to the row's total (float rounding) lands past the last positive entry: the draw
    takes that entry, never the zero-probability tail (a VLM's banned vision tokens sit there)."""
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=torch.float64))
    probs = torch.tensor([[0.2, 0.7, 0.1, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0, 0.5]])
    assert draw(probs, None).tolist() == [2, 4]


def test_restores_each_modules_mode(
    sampler: HFSampler, model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase
) -> None:
    model.train()
    model.model.layers[0].eval()
    try:
        sampler.generate(requests(tokenizer)[:1], greedy(max_new_tokens=2))
        assert model.training and model.lm_head.training
        assert not model.model.layers[0].training and not model.model.layers[0].mlp.training
    finally:
        model.eval()


def test_load_weights_shared_is_noop_and_foreign_is_copied(tokenizer: PreTrainedTokenizerBase) -> None:
    model, other = make_model(0), make_model(1)
    sampler = HFSampler(model, tokenizer)
    before = [r.token_ids for r in sampler.generate(requests(tokenizer), greedy())]

    embed = model.model.embed_tokens.weight
    sampler.load_weights(model.state_dict(), version=1)  # synchronous mode: the trainer's own tensors
    assert sampler.policy_version == 1
    assert model.model.embed_tokens.weight is embed

    sampler.load_weights(other.state_dict(), version=2)
    assert sampler.policy_version == 2
    assert model.model.embed_tokens.weight is embed  # copied in place, not replaced
    after = [r.token_ids for r in sampler.generate(requests(tokenizer), greedy())]
    expected = [r.token_ids for r in HFSampler(other, tokenizer).generate(requests(tokenizer), greedy())]
    assert after == expected != before
    assert all(r.policy_version == 2 for r in sampler.generate(requests(tokenizer), greedy(max_new_tokens=1)))

    with pytest.raises(KeyError):
        sampler.load_weights({"not.a.weight": torch.zeros(1)}, version=3)
    with pytest.raises(ValueError, match="shape"):
        sampler.load_weights({"lm_head.weight": torch.zeros(1, 64)}, version=3)


def test_runs_a_peft_wrapped_model_with_its_cache(tokenizer: PreTrainedTokenizerBase) -> None:
    model = make_model(0)
    expected = [r.token_ids for r in HFSampler(model, tokenizer).generate(requests(tokenizer), greedy())]
    # A fresh LoRA adapter is zero, so outputs must not change; they would if the cache kwarg were dropped.
    wrapped = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the deprecated `past_key_values` name is not used
        rollouts = HFSampler(wrapped, tokenizer).generate(requests(tokenizer), greedy())
    assert [r.token_ids for r in rollouts] == expected


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=0),
        SamplingParams(temperature=-1),
        SamplingParams(top_p=0),
        SamplingParams(max_new_tokens=0),
    ],
)
def test_rejects_invalid_params(
    sampler: HFSampler, tokenizer: PreTrainedTokenizerBase, params: SamplingParams
) -> None:
    with pytest.raises(ValueError):
        sampler.generate(requests(tokenizer), params)


@pytest.mark.parametrize("max_batch_size", [256, 3])
def test_prefix_cache_continues_a_conversation_exactly_as_a_fresh_prefill(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    monkeypatch: pytest.MonkeyPatch,
    max_batch_size: int,
) -> None:
    cached = HFSampler(model, tokenizer, max_batch_size=max_batch_size)
    fresh = HFSampler(model, tokenizer, max_batch_size=max_batch_size, prefix_cache=False)
    widths = prefill_widths(cached, monkeypatch)
    first = cached.generate(requests(tokenizer), greedy(n=2))  # copies of a prompt share its prefill
    assert {r.finish_reason for r in first} == {"stop", "length"}  # both kinds of row end are stored
    # A prompt the cache has never seen rides in the same batch as the continuations.
    second = [*next_turn(tokenizer, first, " ok "), *requests(tokenizer, ["brand new"])]
    widths.clear()
    params = greedy(max_new_tokens=8)
    reused = cached.generate(second, params)
    widths = list(widths)  # the model is shared: what `fresh` prefills is not the cache's
    recomputed = fresh.generate(second, params)
    for a, b in zip(reused, recomputed, strict=True):
        assert a.response_ids == b.response_ids
        expected = torch.tensor(b.sampler_logprobs, dtype=torch.float64)
        torch.testing.assert_close(
            torch.tensor(a.sampler_logprobs, dtype=torch.float64), expected, atol=ATOL, rtol=0
        )
        torch.testing.assert_close(
            torch.tensor(a.sampler_logprobs, dtype=torch.float64),
            full_forward_logprobs(model, a, 0.0),
            atol=ATOL,
            rtol=0,
        )
    # Continuations prefill only the last sampled token and the observation (the new prompt: all of it).
    assert max(widths) == len(tokenizer("brand new")["input_ids"])
    assert sum(widths) < sum(len(r.prompt_ids) for r in second) / 2


def test_prefix_cache_is_dropped_when_weights_change_in_place_are_loaded_or_change_dtype(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(1, torch.float32)  # becomes float64 with the first change, where log-probs compare
    sampler = HFSampler(model, tokenizer)
    widths = prefill_widths(sampler, monkeypatch)

    def optimizer_step() -> None:  # a synchronous run's update: in place, no load_weights call
        with torch.no_grad():
            next(model.parameters()).mul_(1.5)

    for change in (model.double, optimizer_step, lambda: sampler.load_weights({}, sampler.policy_version)):
        first = sampler.generate(requests(tokenizer), greedy(max_new_tokens=6))
        change()
        second = next_turn(tokenizer, first, " ok ")
        widths.clear()
        after = sampler.generate(second, greedy(max_new_tokens=8))
        assert widths == [max(len(r.prompt_ids) for r in second)]  # everything prefilled again
        for rollout in after:
            torch.testing.assert_close(
                torch.tensor(rollout.sampler_logprobs, dtype=torch.float64),
                full_forward_logprobs(model, rollout, 0.0),
                atol=ATOL,
                rtol=0,
            )


def test_prefix_cache_off_never_reads_parameter_versions(tokenizer: PreTrainedTokenizerBase) -> None:
    with torch.inference_mode():  # inference tensors have no version counter to read
        model = make_model(3)
    rollouts = HFSampler(model, tokenizer, prefix_cache=False).generate(requests(tokenizer), greedy())
    assert len(rollouts) == len(PROMPTS)
