"""mkdocs hook: the command-line reference page (`reference/cli.md`), generated from
`hone.cli.parser.parser()` at every build, so it can never go stale. The page is not a file in `docs/`: `on_files` adds it, and
`on_page_markdown` fills it with each command's `--help` text."""

from __future__ import annotations

import argparse
import os

from mkdocs.structure.files import File, Files

PAGE = "reference/cli.md"
INTRO = """# Command line

Generated from `hone.cli` when the site is built: each command's `--help`, verbatim. Every command takes
a recipe (a file path or a packaged recipe's name) and then `section.key=value` overrides; see
[Recipes](../concepts/recipes.md).
"""


def _help(parser: argparse.ArgumentParser) -> str:
    os.environ.setdefault("COLUMNS", "110")  # argparse wraps at the terminal's width: fix it
    return parser.format_help().rstrip()


def cli_markdown() -> str:
    from hone.cli.parser import parser as _parser

    parser = _parser()
    parts = [INTRO, "## hone\n", "```text\n" + _help(parser) + "\n```\n"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts += [f"## hone {name}\n", "```text\n" + _help(sub) + "\n```\n"]
    return "\n".join(parts)


def on_files(files: Files, config: dict) -> Files:
    if files.get_file_from_path(PAGE) is None:
        files.append(File.generated(config, PAGE, content=INTRO))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == PAGE:
        return cli_markdown()
    return markdown
