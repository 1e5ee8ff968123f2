"""The `hone` command line: `main` parses the words (`parser`), loads the recipe and runs one command
(train, sft, eval, pairs, collect, dpo, rm, config). It may import every package; nothing imports it."""

from hone.cli.main import main

__all__ = ["main"]
