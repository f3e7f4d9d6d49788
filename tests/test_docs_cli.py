"""docs/cli.md is the parser's own help (``tuner.cli.parser()``), so the CLI reference cannot drift.

``python tests/test_docs_cli.py`` rewrites docs/cli.md; the test fails, saying that command, when a
flag, a default or a help text in tuner/cli.py changed without it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs" / "cli.md"
WIDTH = "100"  # columns argparse wraps the help at, whatever the terminal


def _subparsers(root: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def render() -> str:
    """docs/cli.md: every command's ``--help``, as ``python -m tuner COMMAND --help`` prints it."""
    from tuner.cli import parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        root = parser()
        commands = _subparsers(root)
        parts = [
            "# Command-line reference",
            "",
            "<!-- generated from tuner.cli.parser() by `python tests/test_docs_cli.py`; "
            "tests/test_docs_cli.py fails when it is stale -->",
            "",
            "Every command and flag, as `--help` prints it. What the flags mean for a study (trials, seeds, racing,",
            "verification, the pruners) is in [concepts.md](concepts.md).",
            "",
            "```text",
            root.format_help().rstrip(),
            "```",
        ]
        for name, sub in commands.items():
            parts += ["", f"## `{name}`", "", "```bash", f"python -m tuner {name} --help", "```", "",
                      "```text", sub.format_help().rstrip(), "```"]
        return "\n".join(parts) + "\n"
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def test_docs_cli_md_is_the_parsers_help() -> None:
    assert CLI_MD.read_text() == render(), "docs/cli.md is stale: run `python tests/test_docs_cli.py`"


def test_docs_cli_md_names_every_flag_of_every_command() -> None:
    """The rendering itself: each flag of each subcommand appears in its section."""
    from tuner.cli import parser

    text = render()
    for name, sub in _subparsers(parser()).items():
        section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        flags = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
        assert flags and all(flag in section for flag in flags), name


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    CLI_MD.write_text(render())
    print(f"wrote {CLI_MD.relative_to(ROOT)}")
