"""`hone serve tinker`: the Tinker REST API on a local port, backed by Hone's parts.

`TinkerServer` runs the HTTP side (aiohttp) on a thread of its own with its own event loop, and the work on
the futures' one worker thread; `serve` is the command: it starts one, prints where, and runs until Ctrl-C
or SIGTERM, which stop it cleanly (the request running finishes; queued ones are dropped).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from pathlib import Path

from aiohttp import web

from hone.tinker.api import TinkerAPI, refusals
from hone.tinker.engine import Engine
from hone.tinker.futures import Futures
from hone.tinker.store import Store
from hone.training.policy import DType

log = logging.getLogger("hone")

_START_TIMEOUT_S = 30.0


class TinkerServer:
    """The Tinker API on `host:port` (port 0: a free one, then `port` says which), checkpoints under
    `run_dir`. `base_models` are listed by `get_server_capabilities` (any base model Hone can load is
    accepted); `preload` loads them at start so the first `create_model` does not wait for it."""

    def __init__(
        self,
        run_dir: Path,
        *,
        base_models: list[str],
        host: str = "127.0.0.1",
        port: int = 8000,
        dtype: DType = "float32",
        device: str = "auto",
        seed: int = 0,
        preload: bool = False,
        poll_s: float = 20.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.base_models = base_models
        self.engine = Engine(dtype=dtype, device=device, seed=seed)
        if preload:
            for name in base_models:
                self.engine.base(name)
        self.store = Store(self.run_dir)
        try:
            self._sock = socket.create_server((host, port))
        except OSError as e:
            raise OSError(f"hone serve tinker: cannot listen on {host}:{port}: {e}") from e
        self.host, self.port = host, self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self.futures = Futures(self._loop, poll_s=poll_s)
        self.api = TinkerAPI(self.engine, self.store, self.futures, base_models=base_models)
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="hone-tinker-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TinkerServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=_START_TIMEOUT_S)
        return self

    def close(self) -> None:
        """Stop answering, then stop the worker after the request it is running."""
        if self._runner is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
            except Exception as e:  # a stop that cannot finish must not hide why the server is stopping
                log.warning("hone serve tinker: the HTTP server did not stop cleanly: %s", e)
            self._runner = None
        self.futures.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> TinkerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _start(self) -> None:
        # Forward/backward batches and sampled outputs can be large: up to 1 GiB a request.
        app = web.Application(client_max_size=1 << 30, middlewares=[refusals])
        app.add_routes(self.api.routes())
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, shutdown_timeout=1.0).start()


def serve(
    run_dir: Path,
    *,
    base_models: list[str],
    host: str,
    port: int,
    dtype: DType,
    device: str,
    seed: int,
) -> int:
    """Run the server until interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM by `signals_interrupt`)."""
    server = TinkerServer(
        run_dir,
        base_models=base_models,
        host=host,
        port=port,
        dtype=dtype,
        device=device,
        seed=seed,
        preload=True,
    )
    try:  # from here on a signal stops the server, wherever it lands (even before the lines are out)
        server.start()
        models = ", ".join(base_models)
        print(
            f"hone: Tinker API on {server.url} (base model {models}; checkpoints in {run_dir})\n"
            f"hone: connect with tinker.ServiceClient(base_url={server.url!r}, api_key='tml-local')",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("hone: stopping the Tinker server", flush=True)
    finally:
        server.close()
    return 0
