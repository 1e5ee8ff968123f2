"""Which Hone this is: the installed package's version and, in a git checkout, its commit.

`hone --version` prints it and every run's `config.yaml` records it, so a result can be traced to the code
that produced it.
"""

from __future__ import annotations

import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGE = "hone-rl"


@cache
def hone_version() -> str:
    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@cache
def hone_commit() -> str | None:
    """The checkout's commit (`+dirty` with uncommitted changes to tracked files); None outside git."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        commit = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git binary, or a broken checkout
        return None
    return commit + ("+dirty" if dirty else "") if commit else None


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True
    ).stdout.strip()


def version_line() -> str:
    """'hone 0.1.0 (commit 1a2b3c4d5e6f)'."""
    commit = hone_commit()
    return f"hone {hone_version()}" + (f" (commit {commit})" if commit else "")
