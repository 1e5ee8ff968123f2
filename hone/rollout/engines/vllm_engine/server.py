"""The vLLM engine server: runs in the vLLM environment's Python, never imports Hone.

vLLM pins a transformers older than Hone's, so the engine lives in a process of its own, started by
`hone.rollout.engines.vllm.VLLMSampler` as `<vllm python> -I server.py` with one end of a socket pair as fd
`HONE_VLLM_FD`. Messages are plain dicts (`multiprocessing.connection`: the trainer's own child, the same
Python), one reply per request, protocol version `PROTOCOL`:

    {"op": "hello"}                                  -> {"ok": True, "protocol", "vllm"}
    {"op": "generate", "prompts": [[ids]], "images": [[png bytes] | None], "max_tokens": [int],
     "seeds": [int | None], "params": {..., "banned_token_ids": [int]}}
                                                     -> {"ok": True, "outputs": [{"token_ids",
                                                         "logprobs", "finish_reason",
                                                         "prompt_token_ids" (image rows only)}]}
    {"op": "load", "path": "<dir with model.safetensors>"}    -> {"ok": True, "seconds"}
    {"op": "shutdown"}                               -> {"ok": True}, then exit
    any failure                                      -> {"ok": False, "error": "<one line>"}

An image row's ids hold one `<|image_pad|>` per image (vLLM expands each to the image's tokens itself,
from the processor's grid, and returns the expanded ids); its images arrive as PNG bytes, in order, and
go to vLLM as PIL images (`multi_modal_data`), through the model's processor in this environment.
`banned_token_ids` (a vision model's image/video pads and vision start/end) are never sampled: every
other id of the vocabulary is the request's `allowed_token_ids`, which vLLM masks to -inf before the
temperature, so the processed log-probs are those of the renormalised rest, as Hone's HF sampler and
trainer compute them.

Weights arrive as a safetensors file on tmpfs, the full state dict (never part of one: a layer given only
some tensors would end up partly uninitialised), loaded in place by the worker extension below.

The engine never outlives the trainer: the server leads its own process group (vLLM's engine processes
join it) and kills the group when the socket closes (the trainer exited or died), on SIGTERM (which the
kernel sends it when the trainer dies, `PR_SET_PDEATHSIG`) and on shutdown.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection

PROTOCOL = 3

# Qwen2-VL models without torchvision (see hone_vllm_shim.py). At import, not in main(): vLLM's engine
# process is spawned and re-imports this file as its main module, so it gets the shim too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hone_vllm_shim  # type: ignore[import-not-found]  # noqa: E402

hone_vllm_shim.apply()


def _kill_group(*_: object) -> None:
    """Take vLLM's engine processes down with this one (vllm #55510 leaves them behind otherwise)."""
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(1)


def _sampling_params(params: dict, max_tokens: int, seed: int | None, allowed: list[int] | None):
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        temperature=params["temperature"],
        top_p=params["top_p"],
        top_k=params["top_k"],
        max_tokens=max_tokens,
        stop=params["stop"] or None,
        stop_token_ids=params["stop_token_ids"],
        include_stop_str_in_output=True,  # the stop string's tokens are part of the response, as in HF
        seed=seed,
        logprobs=0,  # the sampled token's own log-prob only
        detokenize=bool(params["stop"]),  # stop strings need text; token ids are decoded by Hone
        skip_special_tokens=False,
        allowed_token_ids=allowed,
    )


def _image(data: bytes):
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def _generate(llm, message: dict) -> list[dict]:
    from vllm.inputs import TokensPrompt

    images = message.get("images") or [None] * len(message["prompts"])
    prompts = [
        TokensPrompt(prompt_token_ids=ids)
        if not pngs
        else TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": [_image(p) for p in pngs]})
        for ids, pngs in zip(message["prompts"], images, strict=True)
    ]
    banned = set(message["params"].get("banned_token_ids") or ())
    allowed = None
    if banned:
        vocab = llm.llm_engine.model_config.get_vocab_size()
        allowed = [i for i in range(vocab) if i not in banned]
    params = [
        _sampling_params(message["params"], max_tokens, seed, allowed)
        for max_tokens, seed in zip(message["max_tokens"], message["seeds"], strict=True)
    ]
    results = llm.generate(prompts, params, use_tqdm=False)
    outputs = []
    for result, pngs in zip(results, images, strict=True):
        (completion,) = result.outputs
        logprobs = [
            step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)
        ]
        outputs.append(
            {
                "token_ids": list(completion.token_ids),
                "logprobs": logprobs,
                "finish_reason": "length" if completion.finish_reason == "length" else "stop",
            }
            | ({"prompt_token_ids": list(result.prompt_token_ids)} if pngs else {})
        )
    return outputs


def _load(llm, path: str) -> float:
    started = time.perf_counter()
    llm.collective_rpc("hone_load_weights", args=(path,))
    llm.reset_prefix_cache()  # KV computed with the old weights must never be reused
    # Nor vision-tower outputs (the scheduler's and the runner's encoder caches, together: the load
    # leaves them out of step, "Encoder cache miss" on the next image prompt otherwise).
    llm.llm_engine.reset_encoder_cache()
    return time.perf_counter() - started


def serve(conn: Connection, llm) -> None:
    import vllm

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the trainer is gone
            _kill_group()
        try:
            op = message["op"]
            if op == "hello":
                reply = {"protocol": PROTOCOL, "vllm": vllm.__version__}
            elif op == "generate":
                reply = {"outputs": _generate(llm, message)}
            elif op == "load":
                reply = {"seconds": _load(llm, message["path"])}
            elif op == "fingerprint":
                reply = {"sums": llm.collective_rpc("hone_fingerprint")[0]}
            elif op == "shutdown":
                conn.send({"ok": True})
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send({"ok": True, **reply})
        except Exception as e:  # one line back to the trainer; the engine keeps serving
            traceback.print_exc(file=sys.stderr)
            conn.send({"ok": False, "error": " ".join(f"{type(e).__name__}: {e}".split())})


def main() -> None:
    signal.signal(signal.SIGTERM, _kill_group)
    conn = Connection(int(os.environ["HONE_VLLM_FD"]))
    engine_args = json.loads(os.environ["HONE_VLLM_ARGS"])
    # The worker extension must be importable by vLLM's worker processes, which get this sys.path
    # (inserted at import, above).
    hone_vllm_shim.install_for_registry()
    from vllm import LLM

    try:
        llm = LLM(worker_extension_cls="hone_vllm_worker.HoneWorkerExtension", **engine_args)
    except Exception as e:
        conn.send({"ok": False, "error": " ".join(f"engine start failed: {type(e).__name__}: {e}".split())})
        raise
    conn.send({"ok": True, "ready": True})
    try:
        serve(conn, llm)
    finally:
        conn.close()
        _kill_group()


if __name__ == "__main__":
    main()
