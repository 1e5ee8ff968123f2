"""`logging.video`: the deterministic eval episodes as MP4 files,
`runs/<name>/videos/step-<N>-episode-<i>.mp4`.

Frames are the eval environment's `render()` in `rgb_array` mode: the first after `reset`, then one per step
(gymnasium's `RecordVideo` convention, so an episode of L steps is L + 1 frames), written as they come by
imageio with its ffmpeg plugin (imageio + imageio-ffmpeg, the `video` extra: lighter than `RecordVideo`'s
moviepy). Video is a by-product: where it cannot work (the writer is not installed, the environment cannot
render) one warning says why, and the run goes on without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class Video:
    """Records the first `episodes` episodes of each eval; `on` turns false (with one warning) at the first
    thing that does not work."""

    def __init__(self, folder: Path, episodes: int) -> None:
        self.folder, self.episodes, self.on, self.checked = folder, episodes, True, False
        try:
            import imageio  # noqa: F401
            import imageio_ffmpeg  # noqa: F401
        except ImportError as e:
            self.off(f"{e.name} is not installed (pip install -e '.[video]' in a Hone clone)")

    def off(self, why: str) -> None:
        if self.on:
            log.warning("logging.video: no video: %s", why)
        self.on = False

    def open_env(self, make: Callable[[bool], Any]) -> Any:
        """`make(render)` with rendering while video is on. The first time, the environment's declared
        render modes are checked (an env that cannot render gets our warning, not a crash or gymnasium's)."""
        if self.on and not self.checked:
            self.checked = True
            env = make(False)
            modes = env.metadata.get("render_modes") or []
            env.close()
            if "rgb_array" not in modes:
                self.off(f"the environment cannot render rgb_array frames (its render_modes: {modes})")
        if not self.on:
            return make(False)
        # rgb_array frames need no display: without this, pygame's SDL looks for one and prints an error
        # line on a headless machine (CartPole and the other pygame-drawn envs).
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        try:
            return make(True)
        except Exception as e:  # declared but broken: gymnasium raises TypeError or its Error
            self.off(f"the environment cannot render rgb_array frames ({type(e).__name__}: {e})")
            return make(False)

    def episode(self, env: Any, step: int, index: int) -> Episode | None:
        if not self.on or index >= self.episodes:
            return None
        fps = float(env.metadata.get("render_fps") or 30)
        return Episode(self, self.folder / f"step-{step}-episode-{index}.mp4", fps, env)


class Episode:
    """One MP4 being written; `frame()` after reset and after each step, `close()` at the end."""

    def __init__(self, video: Video, path: Path, fps: float, env: Any) -> None:
        self.video, self.path, self.fps, self.env = video, path, fps, env
        self.writer: Any = None

    def frame(self) -> None:
        if not self.video.on:
            return
        try:
            frame = self.env.render()
            if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                raise ValueError(f"render() returned {type(frame).__name__}, not an RGB array")
            if self.writer is None:
                import imageio

                self.path.parent.mkdir(parents=True, exist_ok=True)
                # macro_block_size 2: H.264 needs even sides; CartPole's 600×400 stays unscaled.
                self.writer = imageio.get_writer(self.path, fps=self.fps, codec="libx264", macro_block_size=2)
            self.writer.append_data(frame)
        except Exception as e:
            self.close()
            self.video.off(f"{type(e).__name__}: {e}")

    def close(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()
