"""The training-run and checkpoint routes the SDK's `RestClient` calls: list and get training runs, list a
run's (or every run's) checkpoints, a checkpoint's weights info, delete a checkpoint.

They read the server's run directory (`hone.tinker.store`), so they list what was saved before a restart
too. A training run is a training client (`create_model`, or a client made from a checkpoint); its
`last_request_time` is the time of its newest checkpoint, or its creation: the server keeps no log of
requests. Everything is owned by one local owner and nothing is public.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from aiohttp import web
from tinker import types

from hone.tinker.store import Store, read_meta
from hone.tinker.wire import WireError

OWNER = "local"
_TYPES: dict[str, types.CheckpointType] = {"weights": "training", "sampler_weights": "sampler"}


def _time(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _metadata(value: dict[str, Any] | None) -> dict[str, str] | None:
    # The SDK's responses type user metadata as strings; a create_model's may hold other JSON values.
    return None if value is None else {str(k): str(v) for k, v in value.items()}


def checkpoint(record: dict[str, Any]) -> types.Checkpoint:
    """A stored checkpoint (`Store.checkpoints`) as the SDK's `Checkpoint`."""
    return types.Checkpoint(
        checkpoint_id=f"{record['kind']}/{record['name']}",
        checkpoint_type=_TYPES[record["kind"]],
        time=_time(record["time"]),
        tinker_path=record["tinker_path"],
        size_bytes=record["size_bytes"],
        user_metadata=_metadata(record.get("user_metadata")),
    )


def _page(request: web.Request) -> tuple[int, int]:
    """(offset, limit) from the query (the SDK's defaults: 0 and 20)."""
    try:
        offset = int(request.query.get("offset", 0))
        limit = int(request.query.get("limit", 20))
    except ValueError as e:
        raise WireError(f"{request.path}: limit and offset must be integers ({e})") from e
    if offset < 0 or limit < 0:
        raise WireError(f"{request.path}: limit and offset must be >= 0, got {limit} and {offset}")
    return offset, limit


def _json(model: Any) -> web.Response:
    return web.json_response(model.model_dump(mode="json"))


class RunRoutes:
    """The routes, on the store's run directory."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def routes(self, prefix: str) -> list[web.RouteDef]:
        runs = f"{prefix}/training_runs"
        return [
            web.get(runs, self.list_runs),
            web.get(f"{runs}/{{model_id}}", self.get_run),
            web.get(f"{runs}/{{model_id}}/checkpoints", self.list_checkpoints),
            # A checkpoint id holds a '/' (`weights/<name>`), as `ParsedCheckpointTinkerPath` makes it.
            web.delete(f"{runs}/{{model_id}}/checkpoints/{{checkpoint_id:.+}}", self.delete_checkpoint),
            web.get(f"{prefix}/checkpoints", self.list_all_checkpoints),
            web.post(f"{prefix}/weights_info", self.weights_info),
        ]

    def training_run(self, record: dict[str, Any]) -> types.TrainingRun:
        saved = [checkpoint(c) for c in self.store.checkpoints(record["model_id"])]
        training = [c for c in saved if c.checkpoint_type == "training"]
        sampler = [c for c in saved if c.checkpoint_type == "sampler"]
        return types.TrainingRun(
            training_run_id=record["model_id"],
            base_model=record["base_model"],
            model_owner=OWNER,
            is_lora=True,
            lora_rank=record["lora"]["rank"],
            last_request_time=_time(record["updated"]),
            last_checkpoint=training[-1] if training else None,
            last_sampler_checkpoint=sampler[-1] if sampler else None,
            user_metadata=_metadata(record.get("user_metadata")),
        )

    async def list_runs(self, request: web.Request) -> web.Response:
        records = self.store.runs()
        offset, limit = _page(request)
        page = [self.training_run(r) for r in records[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(records))
        return _json(types.TrainingRunsResponse(training_runs=page, cursor=cursor))

    async def get_run(self, request: web.Request) -> web.Response:
        return _json(self.training_run(self.store.run(request.match_info["model_id"])))

    async def list_checkpoints(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        self.store.run(model_id)  # an unknown run is an error, not an empty list
        saved = [checkpoint(c) for c in self.store.checkpoints(model_id)]
        return _json(types.CheckpointsListResponse(checkpoints=saved))

    async def list_all_checkpoints(self, request: web.Request) -> web.Response:
        records = [c for r in self.store.runs() for c in self.store.checkpoints(r["model_id"])]
        records.sort(key=lambda c: (-c["time"], c["tinker_path"]))  # newest first, across runs
        offset, limit = _page(request)
        page = [checkpoint(c) for c in records[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(records))
        return _json(types.CheckpointsListResponse(checkpoints=page, cursor=cursor))

    async def weights_info(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            tinker_path = str(body["tinker_path"])
        except (ValueError, KeyError, TypeError) as e:
            raise WireError(f"{request.path}: the body must be JSON with a tinker_path ({e})") from e
        base_model, lora, _ = read_meta(self.store.locate(tinker_path))
        info = types.WeightsInfoResponse(
            base_model=base_model,
            is_lora=True,
            lora_rank=lora.rank,
            train_unembed=lora.train_unembed,
            train_mlp=lora.train_mlp,
            train_attn=lora.train_attn,
        )
        return _json(info)

    async def delete_checkpoint(self, request: web.Request) -> web.Response:
        model_id, checkpoint_id = request.match_info["model_id"], request.match_info["checkpoint_id"]
        self.store.delete(f"tinker://{model_id}/{checkpoint_id}")
        return web.json_response({})
