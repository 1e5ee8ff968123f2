"""The Tinker REST API's routes (`/api/v1/...`), as the `tinker` SDK 0.38.0 calls them.

Requests are read with the SDK's own request types (so a field the SDK sends is a field this server reads)
and answered with its response shapes. A route that does work (create a model, a forward/backward, an
optimizer step, a save or load, a sample) queues it on the futures' worker and answers a future at once;
the rest answer directly. A request the server cannot serve is refused in one line: a 400 with
`{"detail": ...}` at once when the request itself says it (an unknown model, a missing checkpoint, an
option not served), or a failed future with category `user` when it shows only while running.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, TypeVar

import pydantic
from aiohttp import web
from tinker import types

from hone.tinker.engine import Engine, LoraSpec
from hone.tinker.futures import Futures, Payload
from hone.tinker.runs import RunRoutes
from hone.tinker.sampling import SamplerWeights, Sampling
from hone.tinker.store import Kind, Store, read_adapter, read_meta, read_optimizer
from hone.tinker.wire import PROTO, WireError, forward_backward_output, read_forward_backward

M = TypeVar("M", bound=pydantic.BaseModel)


def error(status: int, message: str) -> web.Response:
    """A refusal the SDK raises as its status's exception (`BadRequestError`, `NotFoundError`), unretried."""
    return web.json_response({"detail": message}, status=status, headers={"x-should-retry": "false"})


@web.middleware
async def refusals(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except WireError as e:
        return error(400, str(e))
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return error(400, f"{request.path}: {where}: {first['msg']} ({e.error_count()} error(s))")


async def read(request: web.Request, model: type[M]) -> M:
    try:
        body = await request.json()
    except ValueError as e:
        raise WireError(f"{request.path}: the body is not JSON ({e})") from e
    return model.model_validate(body)


class TinkerAPI:
    """The routes and what they share: sessions, training clients (in `engine`), sampling sessions."""

    def __init__(self, engine: Engine, store: Store, futures: Futures, *, base_models: list[str]) -> None:
        self.engine, self.store, self.futures = engine, store, futures
        self.sampling = Sampling(engine)
        self.base_models = base_models
        self.sessions: dict[str, float] = {}  # session id -> last heartbeat
        self.samplers: dict[str, SamplerWeights] = {}

    def routes(self) -> list[web.RouteDef]:
        p = "/api/v1"
        return [
            web.get(f"{p}/healthz", self.healthz),
            web.post(f"{p}/client/config", self.client_config),
            web.post(f"{p}/client/dynamic_config", self.client_dynamic_config),
            web.get(f"{p}/get_server_capabilities", self.capabilities),
            web.post(f"{p}/create_session", self.create_session),
            web.post(f"{p}/session_heartbeat", self.heartbeat),
            web.post(f"{p}/sessions/{{session_id}}/finish", self.empty),
            web.post(f"{p}/telemetry", self.telemetry),
            web.post(f"{p}/retrieve_future", self.retrieve_future),
            web.post(f"{p}/cancel_future", self.cancel_future),
            web.post(f"{p}/create_model", self.create_model),
            web.post(f"{p}/get_info", self.get_info),
            web.post(f"{p}/forward_backward", self.forward_backward),
            web.post(f"{p}/optim_step", self.optim_step),
            web.post(f"{p}/save_weights", self.save_weights),
            web.post(f"{p}/save_weights_for_sampler", self.save_weights_for_sampler),
            web.post(f"{p}/load_weights", self.load_weights),
            web.post(f"{p}/create_sampling_session", self.create_sampling_session),
            web.get(f"{p}/samplers/{{sampler_id}}", self.get_sampler),
            web.post(f"{p}/asample", self.asample),
            *RunRoutes(self.store).routes(p),
            web.route("*", "/{tail:.*}", self.unknown),
        ]

    # Start-up, sessions, futures.

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def client_config(self, request: web.Request) -> web.Response:
        # API keys as they are (no JWT exchange); requests uncompressed; a forward_backward's chunks sent
        # one after another, so they reach the one worker in the client's order.
        config = types.ClientConfigResponse(
            pjwt_auth_enabled=False, proto_compress_fwdbwd=False, parallel_fwdbwd_chunks=False
        )
        return web.json_response(config.model_dump(mode="json"))

    async def client_dynamic_config(self, request: web.Request) -> web.Response:
        return web.json_response(types.ClientDynamicConfigResponse().model_dump(mode="json"))

    async def capabilities(self, request: web.Request) -> web.Response:
        names = list(dict.fromkeys([*self.base_models, *self.engine.bases]))
        models = [{"model_name": n, "trainable": True, "sampleable": True} for n in names]
        return web.json_response({"supported_models": models})

    async def create_session(self, request: web.Request) -> web.Response:
        await read(request, types.CreateSessionRequest)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = time.time()
        return web.json_response({"type": "create_session", "session_id": session_id})

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await read(request, types.SessionHeartbeatRequest)
        self.sessions[body.session_id] = time.time()
        return web.json_response({"type": "session_heartbeat"})

    async def empty(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def telemetry(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "accepted"})  # read by no one: the server keeps no telemetry

    async def retrieve_future(self, request: web.Request) -> web.Response:
        body = await read(request, types.FutureRetrieveRequest)
        status, payload = await self.futures.retrieve(body.request_id)
        if payload.proto is not None:
            return web.Response(body=payload.proto, content_type=PROTO)
        return web.json_response(payload.json, status=status)

    async def cancel_future(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.futures.cancel(str(body.get("request_id", "")))
        return web.json_response({})

    async def unknown(self, request: web.Request) -> web.Response:
        return error(404, f"{request.method} {request.path} is not served by hone serve tinker")

    def _future(self, kind: str, work: Any, model_id: str | None = None) -> web.Response:
        request_id = self.futures.submit(kind, work)
        return web.json_response({"request_id": request_id, "model_id": model_id})

    # Training clients.

    async def create_model(self, request: web.Request) -> web.Response:
        body = await read(request, types.CreateModelRequest)
        if body.lora_config is None:
            raise WireError("create_model: full fine-tuning is not served; pass a LoRA config (rank)")
        _check_adam(body.optimizer_config)
        lora = body.lora_config
        spec = LoraSpec(lora.rank, lora.train_mlp, lora.train_attn, lora.train_unembed, lora.seed)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"

        def work() -> Payload:
            self.engine.create(model_id, body.base_model, spec)
            self.store.write_run(model_id, body.base_model, spec, body.user_metadata)
            return Payload({"model_id": model_id, "type": "create_model"})

        return self._future("create_model", work, model_id)

    async def get_info(self, request: web.Request) -> web.Response:
        body = await read(request, types.GetInfoRequest)
        trainee = self.engine.trainee(body.model_id)
        base = trainee.base
        model_data = {
            "arch": getattr(base.hf_model.config, "model_type", None),
            "model_name": base.name,
            "tokenizer_id": base.path,  # a local directory when the base is (tiny, packaged): loads offline
        }
        info = {
            "type": "get_info",
            "model_data": model_data,
            "model_id": body.model_id,
            "is_lora": True,
            "lora_rank": trainee.lora.rank,
            "model_name": base.name,
        }
        return web.json_response(info)

    async def forward_backward(self, request: web.Request) -> web.Response:
        fb = read_forward_backward(await request.read(), request.headers.get("Content-Encoding"))
        self.engine.trainee(fb.model_id)  # an unknown model is refused now, not when the future runs

        def work() -> Payload:
            outputs, metrics = self.engine.forward_backward(
                fb.model_id, fb.data, fb.loss_fn, fb.loss_fn_config, forward_only=fb.forward_only
            )
            return Payload(proto=forward_backward_output(outputs, metrics))

        return self._future("forward" if fb.forward_only else "forward_backward", work, fb.model_id)

    async def optim_step(self, request: web.Request) -> web.Response:
        body = await read(request, types.OptimStepRequest)
        params = body.optim_params
        if not isinstance(params, types.AdamParams):
            raise WireError(f"optim_step: only Adam is served, got {type(params).__name__}")
        self.engine.trainee(body.model_id)
        return self._future(
            "optim_step",
            lambda: Payload({"metrics": self.engine.optim_step(body.model_id, params)}),
            body.model_id,
        )

    async def save_weights(self, request: web.Request) -> web.Response:
        body = await read(request, types.SaveWeightsRequest)
        trainee = self.engine.trainee(body.model_id)
        name = body.path or f"state-{body.seq_id or 0:06d}"

        def work() -> Payload:
            adapter, optimizer = self.engine.state(body.model_id)
            path = self._save(
                trainee, body.model_id, "weights", name, adapter,
                optimizer=optimizer, overwrite=body.overwrite, user_metadata=body.user_metadata,
            )  # fmt: skip
            return Payload({"path": path, "type": "save_weights"})

        return self._future("save_weights", work, body.model_id)

    def _save(self, trainee: Any, model_id: str, kind: Kind, name: str, adapter: Any, **extra: Any) -> str:
        """A training client's adapter (and what `extra` adds) saved as `tinker://<model_id>/<kind>/<name>`."""
        return self.store.save(
            model_id,
            kind,
            name,
            adapter=adapter,
            config=trainee.base.peft_config(trainee.adapter),
            base_model=trainee.base.name,
            lora=trainee.lora,
            **extra,
        )

    async def save_weights_for_sampler(self, request: web.Request) -> web.Response:
        body = await read(request, types.SaveWeightsForSamplerRequest)
        trainee = self.engine.trainee(body.model_id)
        if body.kind != "snapshot":
            raise WireError(f"save_weights_for_sampler: kind {body.kind!r} is not served (snapshot only)")

        def work() -> Payload:
            adapter, _ = self.engine.state(body.model_id)
            if body.path is None:  # save_weights_and_get_sampling_client: an in-memory snapshot
                session = body.model_id.rpartition(":train:")[0]
                sampler_id = f"{session}:sample:{body.sampling_session_seq_id}"
                self.samplers[sampler_id] = SamplerWeights(
                    sampler_id, trainee.base.name, trainee.lora, adapter
                )
                return Payload({"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})
            path = self._save(
                trainee, body.model_id, "sampler_weights", body.path, adapter,
                overwrite=True, user_metadata=body.user_metadata,
            )  # fmt: skip
            return Payload({"path": path, "type": "save_weights_for_sampler"})

        return self._future("save_weights_for_sampler", work, body.model_id)

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await read(request, types.LoadWeightsRequest)
        directory = self.store.locate(body.path)
        saved_base, spec, _ = read_meta(directory)
        if body.model_id is not None:  # into an existing training client
            model_id, trainee = body.model_id, self.engine.trainee(body.model_id)
            if (trainee.base.name, trainee.lora.layout()) != (saved_base, spec.layout()):
                raise WireError(
                    f"load_weights: {body.path} is {spec.layout()} on {saved_base}; model {model_id} is "
                    f"{trainee.lora.layout()} on {trainee.base.name}"
                )
            create = False
        elif body.session_id is not None and body.model_seq_id is not None:  # a new client from a checkpoint
            model_id, create = f"{body.session_id}:train:{body.model_seq_id}", True
            _check_adam(body.optimizer_config)
        else:
            raise WireError("load_weights: give model_id, or session_id and model_seq_id")
        base_name = body.base_model or saved_base

        def work() -> Payload:
            if create:
                self.engine.create(model_id, base_name, spec)
                self.store.write_run(model_id, base_name, spec)
            optimizer = read_optimizer(directory, body.path) if body.optimizer else None
            self.engine.load(model_id, read_adapter(directory), optimizer, body.path)
            return Payload({"path": body.path, "model_id": model_id, "type": "load_weights"})

        return self._future("load_weights", work, model_id)

    # Sampling.

    async def create_sampling_session(self, request: web.Request) -> web.Response:
        body = await read(request, types.CreateSamplingSessionRequest)
        sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        self.samplers[sampler_id] = self._weights(sampler_id, body.model_path, body.base_model)
        return web.json_response({"type": "create_sampling_session", "sampling_session_id": sampler_id})

    def _weights(self, key: str, model_path: str | None, base_model: str | None) -> SamplerWeights:
        if model_path is not None:
            directory = self.store.locate(model_path)
            base, spec, _ = read_meta(directory)
            return SamplerWeights(key, base, spec, path=model_path, directory=directory)
        if base_model is None:
            raise WireError("a sampler needs a model_path (tinker://...) or a base_model")
        return SamplerWeights(key, base_model)

    async def get_sampler(self, request: web.Request) -> web.Response:
        sampler_id = request.match_info["sampler_id"]
        weights = self.samplers.get(sampler_id)
        if weights is None:
            return error(404, f"unknown sampler {sampler_id!r}")
        return web.json_response(
            {"sampler_id": sampler_id, "base_model": weights.base, "model_path": weights.path}
        )

    async def asample(self, request: web.Request) -> web.Response:
        body = await read(request, types.SampleRequest)
        _check_sample_options(body)
        if body.sampling_session_id is not None:
            weights = self.samplers.get(body.sampling_session_id)
            if weights is None:
                raise WireError(f"unknown sampling session {body.sampling_session_id!r}")
        else:
            weights = self._weights(
                f"adhoc:{body.model_path or body.base_model}", body.model_path, body.base_model
            )
        prompt = body.prompt.to_ints()
        last_n = body.prompt_logprobs_last_n

        def work() -> Payload:
            proto = self.sampling.sample(
                weights,
                prompt,
                body.sampling_params,
                body.num_samples,
                prompt_logprobs=bool(body.prompt_logprobs),
                prompt_logprobs_last_n=last_n,
            )
            return Payload(proto=proto)

        request_id = self.futures.submit("sample", work)
        ids = [f"{request_id}:{i}" for i in range(body.num_samples)]
        return web.json_response({"request_id": request_id, "sample_sequence_ids": ids})


def _check_adam(config: object) -> None:
    kind = getattr(config, "type", "adamw")
    if config is not None and kind != "adamw":
        raise WireError(f"optimizer {kind!r} is not served (AdamW only)")


def _check_sample_options(body: types.SampleRequest) -> None:
    asked = {
        "topk_prompt_logprobs": body.topk_prompt_logprobs > 0,
        "topk_sample_logprobs": body.topk_sample_logprobs > 0,
        "target_prompt_logprobs": body.target_prompt_logprobs is not None,
        "prompt_alt_tokens_k": body.prompt_alt_tokens_k > 0,
        "record_stability_info": bool(body.record_stability_info),
    }
    refused = [name for name, on in asked.items() if on]
    if refused:
        raise WireError(f"sample: {', '.join(refused)} not served by hone serve tinker yet")
