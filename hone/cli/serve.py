"""`hone serve tinker`: the command's handler (the server itself: `hone.tinker`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hone.config import HoneConfig


def serve_tinker(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    """The Tinker REST API until Ctrl-C or SIGTERM. `model.path` is the base model it loads at start and
    lists (any base model Hone can load is served), `model.dtype`/`model.device` apply to every base model,
    `run.seed` seeds new LoRA adapters, `run.threads` sets torch's threads."""
    from hone.run.lifecycle import advise_if_busy, start_process
    from hone.tinker.server import serve

    start_process(cfg.run)  # `run.threads`
    advise_if_busy()
    run_dir = Path(ns.run_dir) if ns.run_dir else Path(cfg.run.dir) / "tinker"
    return serve(
        run_dir,
        base_models=[cfg.model.path],
        host=ns.host,
        port=ns.port,
        dtype=cfg.model.dtype,
        device=cfg.model.device,
        seed=cfg.run.seed,
    )
