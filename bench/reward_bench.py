"""Reward throughput on this machine: sandboxed programs per second, and math verifications per second.

Sandbox: a trivial program and a ~100 ms CPU-bound one, run `CONCURRENCY` at a time through
`hone.verifiers.sandbox.run_python` (bubblewrap when usable, else process limits), against the peer
`subprocess.run([python, "-c", code])` with no isolation at all, measured in the same run: the ratio is
what the isolation costs.
Math: `hone.rewards.math_reward` on numeric answers (its exact fast path) and on LaTeX answers (through
math-verify), against raw `math_verify.verify(parse(gold), parse(response))` on the same pairs.

    .venv/bin/python bench/reward_bench.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from hone.rewards import math_reward
from hone.verifiers.sandbox import SandboxOptions, resolve_isolation, run_python

CONCURRENCY = 2
CALLS = 40
TRIVIAL = "print(sum(range(10)))"
BUSY_100MS = (
    "import time\nend = time.process_time() + 0.1\nwhile time.process_time() < end:\n    pass\nprint(1)"
)
NUMERIC = [(f"so the answer is {i * 7}.", str(i * 7)) for i in range(200)]
LATEX = [
    (r"Thus $\boxed{\frac{1}{2}}$.", "0.5"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}"),
    (r"The answer is $\sqrt{2}/2$", r"\frac{\sqrt{2}}{2}"),
    (r"\boxed{(0, 1]}", r"(0,1]"),
    (r"\boxed{\{1, 2\}}", r"\{2, 1\}"),
] * 20


def per_second(fn: Callable[[], object], calls: int, concurrency: int = 1) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: fn(), range(calls)))
    return calls / (time.perf_counter() - start)


def bare_subprocess(code: str) -> None:
    subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, timeout=30, check=True)


def sandbox_rows() -> list[tuple[str, float, float]]:
    options = SandboxOptions(timeout_s=10)
    rows = []
    for name, code in [("trivial program", TRIVIAL), ("100 ms CPU program", BUSY_100MS)]:
        run_python(code, limits=options)  # warm the isolation probe and the page cache
        ours = per_second(lambda code=code: run_python(code, limits=options), CALLS, CONCURRENCY)
        peer = per_second(lambda code=code: bare_subprocess(code), CALLS, CONCURRENCY)
        rows.append((name, ours, peer))
    return rows


def math_rows() -> list[tuple[str, float, float]]:
    from math_verify import parse, verify

    def raw(pairs: list[tuple[str, str]]) -> None:
        for response, gold in pairs:
            verify(parse(gold), parse(response))

    def ours(pairs: list[tuple[str, str]]) -> None:
        for response, gold in pairs:
            math_reward(response, gold)

    rows = []
    for name, pairs in [("numeric answers", NUMERIC), ("LaTeX answers", LATEX)]:
        ours(pairs[:5]), raw(pairs[:5])  # first-call imports
        t_ours = _timed(lambda pairs=pairs: ours(pairs))
        t_raw = _timed(lambda pairs=pairs: raw(pairs))
        rows.append((name, len(pairs) / t_ours, len(pairs) / t_raw))
    return rows


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    print(f"sandbox isolation: {resolve_isolation('auto')}, {CONCURRENCY} at a time, {CALLS} calls each")
    print(f"{'workload':22s} {'hone calls/s':>13s} {'peer calls/s':>13s} {'hone/peer':>10s}")
    for name, ours, peer in sandbox_rows():
        print(f"{name:22s} {ours:13.1f} {peer:13.1f} {ours / peer:10.2f}   (peer: bare subprocess)")
    for name, ours, peer in math_rows():
        print(f"{name:22s} {ours:13.0f} {peer:13.0f} {ours / peer:10.2f}   (peer: raw math-verify)")


if __name__ == "__main__":
    main()
