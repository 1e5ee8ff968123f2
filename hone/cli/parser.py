"""The `hone` command line's words: its commands and their options (what they do: `hone.cli`)."""

from __future__ import annotations

import argparse

from hone.config import list_recipes
from hone.config.aliases import PEER_KEYS
from hone.config.keys import candidates, key_names

KEYS_HELP = """every key, its type, default and meaning: `hone config [RECIPE] [overrides]` prints the
resolved recipe with each key described (all keys: docs/reference/config.md).
Override any key as section.key=value."""


class _Version(argparse.Action):
    """`hone --version`, computed only when asked (it runs git for the commit)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from hone.version import version_line

        print(version_line())
        parser.exit()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hone",
        description="RL post-training of language models.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"recipes: {', '.join(list_recipes())}\n\n{KEYS_HELP}",
    )
    parser.add_argument("--version", nargs=0, action=_Version, help="print Hone's version and commit")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in [
        ("train", "RL training"),
        ("sft", "supervised warm-start only"),
        ("eval", "evaluate"),
        ("pairs", "preference pairs sampled from the model, labelled by the recipe's reward"),
        ("dpo", "direct preference optimisation on preference pairs"),
        ("rm", "train a reward model on preference pairs"),
        ("config", "print the resolved config as YAML, each key described"),
        ("collect", "play policies in a control recipe's environment, record a Minari dataset (offline RL)"),
        ("serve", "serve an API on Hone's parts: `hone serve tinker`, the Tinker REST API (tinker SDK)"),
    ]:
        sub = commands.add_parser(
            name,
            help=text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=f"recipes: {', '.join(list_recipes())}\n\n{KEYS_HELP}",
        )
        if name == "serve":
            sub.add_argument("target", choices=["tinker"], help="the API to serve")
        sub.add_argument(
            "args", nargs="*", metavar="RECIPE|key=value", help="recipe name/path, then overrides"
        )
        if name in ("train", "sft", "dpo", "rm"):
            sub.add_argument(
                "--resume", metavar="RUN_DIR", help="continue runs/<name> from its last checkpoint"
            )
        if name in ("train", "config"):
            sub.add_argument(
                "--trl-config",
                metavar="FILE",
                help="a `trl grpo --config` file (TRL GRPOConfig keys) instead of a recipe: its Hone recipe "
                "is printed, then run (config: only printed); overrides still apply",
            )
        if name == "train":
            sub.add_argument(
                "--init",
                metavar="RUN_DIR",
                help="control runs: start from an offline run's final learner (offline-to-online)",
            )
            sub.add_argument(
                "--dry-run",
                action="store_true",
                help="check the recipe, data, reward and tokenizer, print two prompts as the model sees "
                "them, and exit",
            )
        if name in ("sft", "dpo", "rm"):
            sub.add_argument(
                "--dry-run",
                action="store_true",
                help="check the recipe, the training rows and the tokenizer (no model weights load), print "
                "the first example as the model sees it, and exit without writing anything",
            )
        if name == "collect":
            _collect_options(sub)
        if name == "serve":
            _serve_options(sub)
        if name == "config":
            sub.add_argument(
                "--markdown", action="store_true", help="every key as a Markdown reference (the docs' page)"
            )
            sub.add_argument("--schema", action="store_true", help="the recipe's JSON schema (YAML editors)")
        if name == "eval":
            sub.add_argument(
                "--model",
                help="model to evaluate (dir, hub name, or alias); default model.path. A model inside a "
                "run directory, without a recipe, is evaluated with that run's config.yaml",
            )
            sub.add_argument("--out", help="also write the metrics as JSON to this file")
            sub.add_argument(
                "--run",
                metavar="RUN_DIR",
                help="evaluate runs/<name> with its own config.yaml: its latest checkpoint (or final model)",
            )
            sub.add_argument("--step", type=int, metavar="N", help="with --run: checkpoint step-N's model")
            sub.add_argument(
                "--samples", metavar="FILE", help="also write every eval response (and its grade) as JSONL"
            )
            sub.add_argument(
                "--ope",
                action="store_true",
                help="control runs: fitted-Q evaluation of the policy on the dataset data.source (no env)",
            )
    return parser


def flags_as_settings(argv: list[str], unknown: list[str]) -> str | None:
    """The line answering TRL/argparse-style options (`--learning_rate 1e-5`, `--learning_rate=1e-5`,
    `--trainer.lr 1e-5`) that name a setting: each option with the `section.key=value` form of the same
    setting (`trainer.lr=1e-5`), by Hone's key names and the TRL/verl/OpenRLHF aliases an override's
    did-you-mean uses (`PEER_KEYS`), or a key's last part (`--temperature`); None when some unknown option
    names no setting (argparse's error
    then lists them). The value is the option's own (`=value`) or the word after it."""
    said = []
    for word in unknown:
        if not word.startswith("--"):
            return None
        name, eq, value = word[2:].partition("=")
        if not eq:
            at = argv.index(word) + 1
            after = argv[at] if at < len(argv) else ""
            value = after if after and not after.startswith("--") and "=" not in after else "<value>"
        name = name.replace("-", "_")
        # Exact names only: a misspelt option of the command (`--modle`) is not a setting's near miss.
        keys, note = ([name], "") if name in key_names() else candidates(name, PEER_KEYS, fuzzy=False)
        if not keys:
            return None
        given = word if eq or value == "<value>" else f"{word} {value}"
        settings = " or ".join(f"{key}={value}" for key in keys)
        said.append(f"{given} is {settings}" + (f" {note}" if note else ""))
    return "settings are section.key=value words, not --options: " + "; ".join(said) if said else None


def _collect_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--policy",
        action="append",
        required=True,
        help="'random' or a control run (runs/<name>, or a checkpoint's model folder); repeat to share the "
        "episodes between policies in turn",
    )
    sub.add_argument("--episodes", type=int, required=True, help="episodes to record")
    sub.add_argument("--dataset-id", required=True, help="the Minari id, e.g. hone/pendulum/medium-v0")
    sub.add_argument("--out", required=True, help="the datasets' root folder (MINARI_DATASETS_PATH)")
    sub.add_argument("--noise", type=float, default=0.0, help="Gaussian action noise, in half action ranges")
    sub.add_argument("--epsilon", type=float, default=0.0, help="probability of a uniformly random action")
    sub.add_argument("--ref-min-score", type=float, help="a random policy's return (D4RL normalisation)")
    sub.add_argument("--ref-max-score", type=float, help="an expert policy's return (D4RL normalisation)")


def _serve_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sub.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: a free one)")
    sub.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where checkpoints (tinker:// paths) are kept; default run.dir/tinker. A restarted server "
        "given the same directory loads the checkpoints saved before",
    )
