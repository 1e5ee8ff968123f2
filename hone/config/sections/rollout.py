"""`rollout`: how responses are sampled (the engine, sampling parameters, an agent endpoint)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hone.config.base import Section


class RolloutConfig(Section):
    engine: str = Field(
        "hf",
        description="a registered engine (hone.rollout.engines.ENGINES): hf: transformers in this process; "
        "vllm: a vLLM engine in its own environment",
    )
    n: int = Field(8, ge=1, description="samples per prompt (the group size)")
    temperature: float = Field(1.0, gt=0, description="> 0: the trainer scores logits / temperature")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="nucleus sampling: keep the smallest token set with this much probability",
    )
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens; 0 = all")
    max_new_tokens: int = Field(
        16,
        ge=1,
        description="longest response in tokens; a longer one is cut (finish_reason length) (TRL: "
        "max_completion_length)",
    )
    stop: list[str] = Field(default_factory=list, description="strings that end a response (kept in it)")
    max_batch_size: int = Field(512, ge=1, description="most sequences the engine generates at once")
    dtype: Literal["model", "bfloat16"] = Field(
        "model",
        description="an engine that casts its weights (hf): the sampler's copy of the weights in the "
        "policy's dtype, or in bfloat16 (decodes faster on CPUs with AMX and on GPUs; its log-probs then "
        "differ from an fp32 trainer's); other engines sample in model.dtype",
    )
    interruptible: bool = Field(
        False,
        description="async, on an engine and a cluster.backend that declare it (hf, local): a publish "
        "lands mid-generation (between two tokens; the live rows are re-prefilled with the new weights) "
        "instead of at the producer's next share; each token records its version (Rollout.token_versions)",
    )
    prefix_cache: bool = Field(
        True,
        description="keep the KV cache of the last generate call's sequences and prefill only what a new "
        "prompt adds to one (each turn of a multi-turn episode); dropped whenever a weight changes",
    )
    vllm_python: str = Field(
        ".venv-vllm/bin/python", description="vllm: the Python of the vLLM environment (make setup-vllm)"
    )
    vllm_kv_cache_gib: int = Field(
        2, ge=1, description="vllm on CPU: KV cache memory (VLLM_CPU_KVCACHE_SPACE)"
    )
    vllm_timeout_s: float = Field(600.0, gt=0, description="vllm: the most one engine request may take")
    # Agent programs via an OpenAI-compatible endpoint (hone/rollout/agent.py, README).
    agent: str | None = Field(
        None,
        description="'pkg.mod:fn': an async agent run(client | base_url, sample) -> reward that talks to the "
        "policy at a local OpenAI-compatible endpoint; it plays the episodes (an env then only supplies "
        "samples and SFT demonstrations)",
    )
    agent_concurrency: int = Field(32, ge=1, description="agent episodes running at once")
    agent_timeout_s: float = Field(120.0, gt=0, description="the most one agent episode may take")
    agent_max_completions: int = Field(
        8, ge=1, description="chat completions one agent episode may request (its turns)"
    )
    agent_tool_parser: str = Field(
        "hermes", description="how the endpoint reads tool calls in the model's output (hone.envs.parsers)"
    )
    agent_port: int = Field(
        0, ge=0, le=65535, description="the endpoint's port on 127.0.0.1; 0 = any free one"
    )
