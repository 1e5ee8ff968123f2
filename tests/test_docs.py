"""The documentation is tested like code: every fenced block marked `<!-- runnable -->` on the line before
its fence runs (README.md and docs/**/*.md), every relative `.md` link of the README resolves, and the
docs site builds with `mkdocs build --strict`.

A page's runnable blocks run in order in one fresh folder, as a reader would type them: `bash` blocks
with the environment's `bin` first on PATH (so `hone` and `python` are this checkout's), `python` blocks
as scripts in a subprocess.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
BLOCK_TIMEOUT_S = 240


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def runnable_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, line) of every fenced block whose preceding line is the runnable mark."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() == MARK:
            blocks.append((match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1))
    return blocks


def pages_with_runnable_blocks() -> list[Path]:
    return [p for p in markdown_files() if runnable_blocks(p.read_text())]


def test_the_runnable_mark_is_found() -> None:
    """The parser itself: a marked block is found, an unmarked one is not (else the tests below could
    pass by finding nothing)."""
    text = f"x\n\n{MARK}\n```bash\necho hi\n```\n\n```bash\necho no\n```\n"
    assert runnable_blocks(text) == [("bash", "echo hi\n", 4)]
    assert (ROOT / "README.md") in pages_with_runnable_blocks()


def _environment() -> dict[str, str]:
    bins = [ROOT / ".venv" / "bin", Path(sys.executable).parent]
    path = os.pathsep.join([*(str(b) for b in bins if b.is_dir()), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath}


@pytest.mark.parametrize("page", pages_with_runnable_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    env = _environment()
    for language, code, line in runnable_blocks(page.read_text()):
        where = f"{page.relative_to(ROOT)}:{line}"
        if language == "bash":
            command = ["bash", "-euo", "pipefail", "-c", code]
        elif language == "python":
            script = tmp_path / f"block_{line}.py"
            script.write_text(code)
            command = [sys.executable, str(script)]
        else:
            pytest.fail(f"{where}: a runnable block must be bash or python, not {language!r}")
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )
        output = f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        assert done.returncode == 0, f"{where} exited {done.returncode}:\n{output}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readmes_relative_links_resolve() -> None:
    """Every link of the README that is not a URL points at a file in the repository."""
    readme = (ROOT / "README.md").read_text()
    links = [target for target in LINK.findall(readme) if not re.match(r"[a-z]+:", target)]
    assert links, "no relative links found: the pattern is wrong"
    missing = []
    for target in links:
        path = target.split("#", 1)[0]
        if path and not (ROOT / path).resolve().is_file():
            missing.append(target)
        if path and not (ROOT / path).resolve().is_relative_to(ROOT):
            missing.append(f"{target} (outside the repository)")
    assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs / mkdocs-material not installed (pip install -e '.[docs]')",
)
def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
