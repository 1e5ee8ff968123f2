"""Policy: log-prob alignment, padding isolation, micro-batching, LoRA merge and save/load round trips."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import transformers

from hone.training import logprobs
from hone.training.adapter_reference import AdapterReference
from hone.training.logprobs import token_scores
from hone.training.policy import (
    LoraSettings,
    Policy,
    disable_dropout,
    first_response_column,
)
from tests.conftest import char_tokenizer, tiny_qwen2


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "tiny"
    tiny_qwen2().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def policy() -> Policy:
    torch.manual_seed(0)
    return Policy(tiny_qwen2(), char_tokenizer())


# Comparisons between two computation paths (batch shapes, padding, micro-batches, skipped columns, merged
# LoRA weights) run in float64: in fp32 the forward's reductions regroup with the shapes and their rounding
# differs by CPU (1.1e-5 was seen against atol=1e-5). In float64 the paths' logits agree to ~1e-15, and
# only `_score`'s log-softmax/entropy over the n = 32-token vocabulary runs in fp32 (|logits| < 4 in these
# tests: at most 2.9, after the weight perturbations). Each path's result is then within
# n * eps32 * (1 + 2 * max|logit|) of the exact value (the logsumexp's sum of n terms, then the
# entropy's sum of p * logit), two paths twice that.
ATOL64 = 2 * 32 * torch.finfo(torch.float32).eps * (1 + 2 * 4)  # 6.9e-5 on any CPU


@pytest.fixture
def policy64() -> Policy:
    torch.manual_seed(0)
    return Policy(tiny_qwen2().double(), char_tokenizer())


def _float64(policy: Policy) -> Policy:
    """The policy in float64 (LoRA adapters included), for comparisons with ATOL64."""
    policy.model.double()
    return policy


def _plain64(path: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)


def _reference_log_probs(model: torch.nn.Module, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def _perturb_lora(policy: Policy) -> None:
    """peft initialises lora_B to zero; make the adapter non-trivial so merges are actually tested."""
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.2)


def test_log_probs_match_log_softmax_with_temperature(policy64: Policy) -> None:
    ids = torch.randint(3, 32, (2, 9))
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            lp, ent = policy64.token_log_probs(ids, torch.ones_like(ids), temperature=temperature)
            expected = _reference_log_probs(policy64.model, ids, temperature)
            torch.testing.assert_close(lp, expected, rtol=0, atol=ATOL64)
            assert ent is None and lp.shape == (2, 8) and lp.dtype == torch.float32


def test_entropy_matches_distribution(policy64: Policy) -> None:
    ids = torch.randint(3, 32, (2, 7))
    with torch.no_grad():
        _, ent = policy64.token_log_probs(ids, torch.ones_like(ids), with_entropy=True)
        logp = torch.log_softmax(policy64.model(input_ids=ids).logits[:, :-1].float(), -1)
    assert ent is not None
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1), rtol=0, atol=ATOL64)
    assert bool((ent > 0).all()) and bool((ent <= torch.log(torch.tensor(32.0)) + 1e-5).all())


def test_padding_never_leaks_into_real_tokens(policy64: Policy) -> None:
    short = torch.randint(3, 32, (1, 5))
    long = torch.randint(3, 32, (1, 11))
    ids = torch.zeros(2, 11, dtype=torch.long)
    mask = torch.zeros(2, 11, dtype=torch.long)
    ids[0, :5], mask[0, :5] = short[0], 1
    ids[1], mask[1] = long[0], 1
    with torch.no_grad():
        alone, alone_ent = policy64.token_log_probs(short, torch.ones_like(short), with_entropy=True)
        batched, batched_ent = policy64.token_log_probs(ids, mask, with_entropy=True)
        # Left padding scores the same tokens too (positions come from the mask).
        left_ids = torch.cat([torch.zeros(1, 6, dtype=torch.long), short], 1)
        left_mask = torch.cat([torch.zeros(1, 6, dtype=torch.long), torch.ones_like(short)], 1)
        left, _ = policy64.token_log_probs(left_ids, left_mask)
    torch.testing.assert_close(batched[0, :4], alone[0], rtol=0, atol=ATOL64)
    torch.testing.assert_close(batched_ent[0, :4], alone_ent[0], rtol=0, atol=ATOL64)
    assert bool((batched[0, 4:] == 0).all()) and bool((batched_ent[0, 4:] == 0).all())
    torch.testing.assert_close(left[0, 6:], alone[0], rtol=0, atol=ATOL64)


def test_micro_batches_and_all_padding_columns_give_same_result(policy64: Policy) -> None:
    ids = torch.randint(3, 32, (5, 10))
    mask = torch.ones_like(ids)
    mask[:, 7:] = 0  # every row padded at the end: these columns are skipped, then re-padded
    mask[0, 4:] = 0
    with torch.no_grad():
        full, _ = policy64.token_log_probs(ids, mask)
        chunked, _ = policy64.token_log_probs(ids, mask, micro_batch_size=2)
    assert chunked.shape == (5, 9)
    torch.testing.assert_close(chunked, full, rtol=0, atol=ATOL64)
    assert bool((full[:, 6:] == 0).all()) and bool((full[0, 3:] == 0).all())
    assert bool((full[1:, :6] != 0).all())


def test_from_column_scores_only_the_response_and_keeps_its_gradient(policy64: Policy) -> None:
    ids = torch.randint(3, 32, (3, 12))
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0
    response = torch.zeros(3, 11)
    response[0, 5:], response[1, 7:], response[2, 6:8] = 1, 1, 1
    first = first_response_column(response)
    assert first == 5 and first_response_column(torch.zeros(2, 4)) == 0
    full, full_ent = policy64.token_log_probs(ids, mask, with_entropy=True)
    part, part_ent = policy64.token_log_probs(ids, mask, with_entropy=True, from_column=first)
    assert part.shape == full.shape and bool((part[:, :first] == 0).all())
    torch.testing.assert_close(part[:, first:], full[:, first:], rtol=0, atol=ATOL64)
    torch.testing.assert_close(part_ent[:, first:], full_ent[:, first:], rtol=0, atol=ATOL64)
    grads = []
    for lp in (full, part):
        policy64.model.zero_grad()
        (lp * response).sum().backward()
        grads.append([p.grad.clone() for p in policy64.model.parameters()])
    # Float64 sums of the fp32 softmax gradient, which differs between the paths by at most
    # 2 * n * eps32 = 7.6e-6 relative (the lse's rounding, see ATOL64): rtol leaves 13x margin.
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_log_probs_carry_gradient_only_under_grad(policy: Policy) -> None:
    ids = torch.randint(3, 32, (2, 6))
    lp, _ = policy.token_log_probs(ids, torch.ones_like(ids))
    lp.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    with torch.no_grad():
        lp, _ = policy.token_log_probs(ids, torch.ones_like(ids))
    assert not lp.requires_grad


def test_from_pretrained_dtype_and_gradient_checkpointing(model_dir: Path) -> None:
    ids = torch.randint(3, 32, (2, 6))
    plain = Policy.from_pretrained(model_dir)
    ckpt = Policy.from_pretrained(model_dir, gradient_checkpointing=True)
    ckpt.model.train()  # checkpointing is only active in train mode
    grads, layer_calls = [], []
    for pol in (plain, ckpt):
        mlp, calls = pol.model.model.layers[0].mlp, []
        mlp.forward = lambda *a, _f=mlp.forward, _c=calls, **k: _c.append(1) or _f(*a, **k)
        lp, _ = pol.token_log_probs(ids, torch.ones_like(ids))
        lp.sum().backward()
        grads.append(pol.model.model.embed_tokens.weight.grad)
        layer_calls.append(len(calls))
    assert layer_calls == [1, 2]  # checkpointing re-runs the layer in backward
    # One computation path (checkpointing re-runs the same kernels on the same shapes): equal to the bit
    # here; the default fp32 tolerance only allows for a library that does not promise that.
    torch.testing.assert_close(grads[0], grads[1])
    bf16 = Policy.from_pretrained(model_dir, dtype="bfloat16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        lp, _ = bf16.token_log_probs(ids, torch.ones_like(ids))
    assert lp.dtype == torch.float32 and bool(torch.isfinite(lp).all())
    assert plain.tokenizer is not None and plain.tokenizer("ab=").input_ids == [3, 4, 29]


def test_lora_sampler_weights_are_merged_without_touching_the_model(model_dir: Path) -> None:
    # Merged weights against the adapter's separate matmuls: two paths, compared in float64.
    policy = _float64(
        Policy.from_pretrained(
            model_dir, lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
        )
    )
    _perturb_lora(policy)
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    merged = policy.state_dict_for_sampler()
    assert all(torch.equal(v, policy.model.state_dict()[k]) for k, v in before.items())

    plain = _plain64(model_dir)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.randint(3, 32, (2, 8))
    with torch.no_grad():
        lp, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        torch.testing.assert_close(lp, _reference_log_probs(plain, ids), rtol=0, atol=ATOL64)
        # ...and the merge actually changed the base: the un-merged base scores differently.
        base = _plain64(model_dir)
        assert not torch.allclose(lp, _reference_log_probs(base, ids), atol=1e-3)


def test_save_pretrained_and_load_weights_round_trip(model_dir: Path, tmp_path: Path) -> None:
    ids = torch.randint(3, 32, (2, 8))
    for lora in (None, LoraSettings(r=4, alpha=8)):  # float64: the merged reload is another path
        policy = _float64(Policy.from_pretrained(model_dir, lora=lora))
        with torch.no_grad():
            if lora is None:
                for p in policy.model.parameters():
                    p.add_(torch.randn_like(p) * 0.1)
            else:
                _perturb_lora(policy)
            expected, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        out = policy.save_pretrained(tmp_path / f"saved-{lora is not None}")
        assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
        assert (out / "adapter").exists() == (lora is not None)

        reloaded = _plain64(out)  # merged weights, no peft needed
        fresh = _float64(Policy.from_pretrained(model_dir, lora=lora))
        fresh.load_weights(out)
        with torch.no_grad():
            torch.testing.assert_close(_reference_log_probs(reloaded, ids), expected, rtol=0, atol=ATOL64)
            torch.testing.assert_close(fresh.token_log_probs(ids, torch.ones_like(ids))[0], expected)


def test_load_weights_rejects_a_different_architecture(policy: Policy, tmp_path: Path) -> None:
    other = tiny_qwen2(train_mode=True, num_hidden_layers=1, tie_word_embeddings=False)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="do not fit"):
        policy.load_weights(tmp_path / "other")


def test_disable_dropout_makes_the_train_forward_the_eval_forward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tiny_qwen2(attention_dropout=0.5).save_pretrained(tmp_path / "m")
    policy = Policy.from_pretrained(tmp_path / "m", lora=LoraSettings(r=4, alpha=8, dropout=0.5))
    _perturb_lora(policy)
    ids = torch.randint(3, 32, (2, 9))
    policy.model.eval()
    with torch.no_grad():
        evaluated, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        policy.model.train()
        assert not torch.equal(policy.token_log_probs(ids, torch.ones_like(ids))[0], evaluated)
        disable_dropout(policy.model)
        trained, _ = policy.token_log_probs(ids, torch.ones_like(ids))
    assert torch.equal(trained, evaluated)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "m").attention_dropout == 0.5


def test_lora_reference_is_the_base_or_the_start_adapter_without_a_copy(model_dir: Path) -> None:
    policy = _float64(Policy.from_pretrained(model_dir, lora=LoraSettings(r=4, alpha=8)))
    _perturb_lora(policy)
    start = policy.adapter_state()  # e.g. where a warm start left the adapter
    ids = torch.randint(3, 32, (2, 8))
    with torch.no_grad():
        at_start, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        _perturb_lora(policy)  # RL moved the adapter on
        trained, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        base, swapped = AdapterReference(policy), AdapterReference(policy, start)
        plain = _plain64(model_dir)
        torch.testing.assert_close(
            base.token_log_probs(ids, torch.ones_like(ids))[0],
            _reference_log_probs(plain, ids),
            rtol=0,
            atol=ATOL64,
        )
        assert torch.equal(swapped.token_log_probs(ids, torch.ones_like(ids))[0], at_start)
        assert torch.equal(policy.token_log_probs(ids, torch.ones_like(ids))[0], trained)  # swapped back
    assert base.model is policy.model is swapped.model
    with pytest.raises(RuntimeError, match="no_grad"):
        base.token_log_probs(ids, torch.ones_like(ids))


def test_rows_sharing_a_prompt_forward_it_once_and_score_as_if_each_did(
    policy64: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two groups of three rows (prompts of 4 and 6 tokens, answers of uneven lengths, right padding) plus
    a row whose prompt is its own: with `prompt_lens` the shared path scores the same log-probs, entropies
    and gradients as one forward per row, and the model sees each distinct prompt once."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 32, (4,), generator=g), torch.randint(3, 32, (6,), generator=g)]
    rows = [(0, 3), (0, 5), (0, 1), (1, 4), (1, 2), (1, 6), (None, 2)]
    seqs, lens = [], []
    for group, answer in rows:
        prompt = torch.randint(3, 32, (5,), generator=g) if group is None else prompts[group]
        seqs.append(torch.cat([prompt, torch.randint(3, 32, (answer,), generator=g)]))
        lens.append(len(prompt))
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    response = torch.zeros(len(seqs), width - 1)
    for i, (s, n) in enumerate(zip(seqs, lens, strict=True)):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
        response[i, n - 1 : len(s) - 1] = 1
    forwarded: list[int] = []
    real_forward = policy64.model.forward

    @functools.wraps(real_forward)  # keeps the signature, which says the cache keyword's name
    def counting(*args: object, **kwargs: torch.Tensor) -> object:
        forwarded.append(int(kwargs["attention_mask"].shape[0]))
        return real_forward(*args, **kwargs)

    results, grads = [], []
    for prompt_lens in (None, torch.tensor(lens)):
        forwarded.clear()
        monkeypatch.setattr(policy64.model, "forward", counting)
        lp, ent = policy64.token_log_probs(ids, mask, with_entropy=True, prompt_lens=prompt_lens)
        monkeypatch.undo()
        results.append((lp * response, ent * response))
        policy64.model.zero_grad()
        (lp * response).sum().backward()
        grads.append([p.grad.clone() for p in policy64.model.parameters()])
        if prompt_lens is not None:
            assert forwarded == [3, 7]  # the 3 distinct prompts once, then every row's answer
    (full, full_ent), (shared, shared_ent) = results
    assert bool((full != 0).any())
    torch.testing.assert_close(shared, full, rtol=0, atol=ATOL64)
    torch.testing.assert_close(shared_ent, full_ent, rtol=0, atol=ATOL64)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _reference_scores(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, banned: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(z)[target] and the entropy by plain autograd, z = logits / T with banned columns at -inf
    (a target's logit read before the ban)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if banned is not None:
        z = z.index_fill(-1, banned, float("-inf"))
    lse = torch.logsumexp(z, -1)
    p = torch.softmax(z, -1)
    entropy = lse - torch.where(p > 0, p * z, 0.0).sum(-1)
    return picked - lse, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("banned", [None, [2, 5]])
@pytest.mark.parametrize("chunk", [1, 3, 256])  # positions per chunk: within a row, rows, everything
def test_target_log_prob_matches_autograd_values_and_gradients(
    temperature: float, banned: list[int] | None, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused log-prob: forward, entropy metric and the hand-written backward against autograd over the
    formula, in float64 (gradcheck's finite differences too), through a strided slice as `_score` passes."""
    monkeypatch.setattr(logprobs, "SCORE_CHUNK_ELEMENTS", chunk * 11)
    torch.manual_seed(0)
    logits = (torch.randn(3, 6, 11, dtype=torch.float64) * 3)[:, :-1].detach().requires_grad_(False)
    leaf = logits.clone().requires_grad_(True)
    targets = torch.randint(0, 11, (3, 5))
    targets[0, 0] = 2  # a banned target: finite, as the module says
    ban = None if banned is None else torch.tensor(banned)
    lp, ent = logprobs.TargetLogProb.apply(leaf, targets, temperature, ban, True)
    ref_leaf = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = _reference_scores(ref_leaf, targets, temperature, ban)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)
    weights = torch.randn(3, 5, dtype=torch.float64)
    (lp * weights).sum().backward()
    (ref_lp * weights).sum().backward()
    assert leaf.grad is not None and ref_leaf.grad is not None
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=0, atol=1e-12)
    # The ban is applied to copies: the caller's logits stay as given, also in a no-grad log-prob pass.
    assert torch.equal(leaf.detach(), logits)
    plain = logits.clone()
    with torch.no_grad():
        torch.testing.assert_close(
            token_scores(plain, targets, torch.ones(3, 5), temperature, False, False, ban)[0],
            lp.detach().float(),
        )
    assert torch.equal(plain, logits)
    assert torch.autograd.gradcheck(
        lambda x: logprobs.TargetLogProb.apply(x, targets, temperature, ban, False)[0],
        (logits.clone().requires_grad_(True),),
    )


def test_target_log_prob_keeps_bf16_gradients_in_bf16_and_scores_in_fp32() -> None:
    """Under autocast the LM head's logits are bf16: scores come out fp32 (upcast per chunk, no fp32 copy of
    the whole tensor) and the gradient goes back in the logits' own dtype, as `logits.float()` did."""
    torch.manual_seed(0)
    logits = (torch.randn(2, 4, 40) * 2).bfloat16().requires_grad_(True)
    targets = torch.randint(0, 40, (2, 4))
    lp, _ = token_scores(logits, targets, torch.ones(2, 4), 0.7, False, False)
    ref_leaf = logits.detach().clone().requires_grad_(True)
    ref_lp, _ = _reference_scores(ref_leaf, targets, 0.7, None)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-6)
    lp.sum().backward()
    ref_lp.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad, ref_leaf.grad)
