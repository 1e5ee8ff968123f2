"""What a guess-the-number policy does with its observations, by turn (issue 37's evidence).

Reads episodes of `GuessNumber` (recipe `agent-guess`) from a run's `samples.jsonl` (a run with
`logging.samples=128`: every sampled episode, each trained one with its per-turn advantages) or from
`hone eval --samples FILE`'s records (greedy play), and reports per turn index:

- `consistent`: the share of guesses inside the interval the replies so far leave possible (bisection's
  are all consistent; a policy that ignores "higher"/"lower" guesses outside it);
- `repeat`: the share of guesses the episode already made;
- `adv_mean`, `adv_negative`: the mean of the turns' advantages and the share below 0 (trained episodes);
- the success rate and the share of episodes whose first guess is the most common one.

    .venv/bin/python bench/guess_diagnostics.py runs/agent-guess/samples.jsonl --steps 1-20 300-400
    .venv/bin/python bench/guess_diagnostics.py eval-samples.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

_INTEGER = re.compile(r"-?\d+")
_RANGE = re.compile(r"\(1-(\d+)\)")


def guesses(record: dict[str, Any]) -> list[tuple[int | None, bool, bool]]:
    """Each assistant turn's (guess, consistent, repeated) as the game saw it."""
    messages = record["messages"]
    high = int(_RANGE.search(messages[0]["content"]).group(1))  # type: ignore[union-attr]
    low, top, seen, out = 1, high, set(), []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        match = _INTEGER.search(m["content"])
        guess = int(match.group()) if match and len(match.group()) < 10 else None
        out.append((guess, guess is not None and low <= guess <= top, guess in seen))
        seen.add(guess)
        reply = messages[i + 1]["content"] if i + 1 < len(messages) else ""
        if guess is not None and reply == "higher":
            low = max(low, guess + 1)
        elif guess is not None and reply == "lower":
            top = min(top, guess - 1)
    return out


def by_turn(records: list[dict[str, Any]]) -> dict[str, Any]:
    turns: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    first = Counter()
    for record in records:
        played = guesses(record)
        advantages = record.get("turn_advantages") or []
        if played:
            first[played[0][0]] += 1
        for k, (_, consistent, repeated) in enumerate(played):
            turns[k]["consistent"].append(float(consistent))
            turns[k]["repeat"].append(float(repeated))
            if k < len(advantages):
                turns[k]["advantage"].append(advantages[k])
    table = {}
    for k in sorted(turns):
        row = turns[k]
        adv = row["advantage"]
        table[k + 1] = {
            "episodes": len(row["consistent"]),
            "consistent": round(sum(row["consistent"]) / len(row["consistent"]), 3),
            "repeat": round(sum(row["repeat"]) / len(row["repeat"]), 3),
            "adv_mean": round(sum(adv) / len(adv), 3) if adv else None,
            "adv_negative": round(sum(a < 0 for a in adv) / len(adv), 3) if adv else None,
        }
    success = [float(r.get("correct", r.get("reward", 0.0) >= 1.0) or 0.0) for r in records]
    return {
        "episodes": len(records),
        "success": round(sum(success) / max(1, len(success)), 3),
        "first_guess_top_share": round(first.most_common(1)[0][1] / max(1, sum(first.values())), 3)
        if first
        else None,
        "by_turn": table,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("samples", type=Path)
    parser.add_argument("--steps", nargs="*", default=[], help="step ranges A-B of samples.jsonl to report")
    args = parser.parse_args()
    records = [json.loads(line) for line in args.samples.read_text().splitlines() if line.strip()]
    records = [r for r in records if r.get("messages")]
    spans = args.steps or ["0-1000000000"]
    for span in spans:
        lo, hi = (int(x) for x in span.split("-"))
        chosen = [r for r in records if lo <= r.get("step", 0) <= hi]
        summary = by_turn(chosen)
        print(
            f"steps {span}: {summary['episodes']} episodes, success {summary['success']}, "
            f"first-guess top share {summary['first_guess_top_share']}"
        )
        print("  turn  episodes  consistent  repeat  adv_mean  adv_negative")
        for k, row in summary["by_turn"].items():
            print(
                f"  {k:>4}  {row['episodes']:>8}  {row['consistent']:>10}  {row['repeat']:>6}  "
                f"{row['adv_mean']!s:>8}  {row['adv_negative']!s:>12}"
            )


if __name__ == "__main__":
    main()
