"""Every command shown in README.md and docs/*.md (each line of a ```bash block) is run here.

How each kind is run, keeping to one launch:

- the README's main job, ``.venv/bin/python -m tuner launch``: once, in a temp folder (so its default
  stores and outputs land there), with a tiny budget appended (:data:`TINY`); its stores and
  ``best_config.yaml`` serve the commands below;
- ``tuner verify``, ``tuner report``: on that launch's files, ``verify`` with 2 seeds x 20 steps
  (and a bar 2 seeds can reach) appended;
- ``mlflow ui`` and ``optuna-dashboard``: started on that launch's stores (on a free port appended),
  their page fetched once, then stopped;
- ``tuner check-model`` and every ``--help``: as written;
- any other ``tuner launch`` (another model, a server, PostgreSQL): parsed by tuner's parser and
  validated by the config loader a launch runs first (``tuner.config.load_launch``), not trained:
  CI runs one launch here;
- the README's set-up (``python3 -m venv .venv && .venv/bin/pip install ...``) and its test command
  are what CI's ``.ci/run`` runs (checked below); the shell line of docs/operations.md writes a
  ``~/.pgpass`` in a temp HOME.

A command of no known kind fails :func:`test_docs_every_command_is_one_a_test_runs`.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FINISHED, ROOT, run_tuner

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TINY = ["--trials", "1", "--steps", "20", "--seeds", "1", "--race-seeds", "0", "--verify-seeds", "0", "--no-margin"]
VERIFY_TINY = ["--seeds", "2", "--steps", "20", "--min-survival", "0.3"]  # a bar 2 seeds can reach (0.34)
MAIN = ".venv/bin/python -m tuner launch"  # the README's main job, after its set-up
SETUP_MAIN = f"python3 -m venv .venv && .venv/bin/pip install -e . && {MAIN}"
TESTS = ".venv/bin/python -m pytest -n 2 --dist loadfile"  # two test files at a time (pytest-xdist)
SETUP_TESTS = f'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && {TESTS}'
SET_UP = ("python3 -m venv .venv", ".venv/bin/pip install -e .", '.venv/bin/pip install -e ".[dev]"', TESTS)


@dataclass(frozen=True)
class Command:
    """One shell command of a doc: where it is and its text (continuation lines joined)."""

    where: str  # file:line
    text: str

    @property
    def parts(self) -> list[str]:
        """The commands of a ``&&`` chain."""
        return [p.strip() for p in self.text.split("&&")]


def doc_commands() -> list[Command]:
    """Each line of each ```bash (or ```sh) block of README.md and docs/*.md."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        inside = False
        pending, start = "", 0
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                inside = line.strip() in ("```bash", "```sh", "```shell")
                continue
            if not inside or not line.strip() or line.lstrip().startswith("#"):
                continue
            start = start or n
            pending += line.rstrip().removesuffix("\\").strip() + " "
            if not line.rstrip().endswith("\\"):
                found.append(Command(f"{path.relative_to(ROOT)}:{start}", pending.strip()))
                pending, start = "", 0
    return found


COMMANDS = doc_commands()


def tuner_args(part: str) -> list[str] | None:
    """The arguments after ``python -m tuner`` (with or without ``.venv/bin/``), else None."""
    words = shlex.split(part)
    if len(words) >= 3 and Path(words[0]).name in ("python", "python3") and words[1:3] == ["-m", "tuner"]:
        return words[3:]
    return None


def kind(part: str) -> str:
    """How a test runs one command of a chain (see the module docs); "" for none."""
    if part in SET_UP:
        return "set-up"
    args = tuner_args(part)
    if args is not None:
        if "--help" in args or "-h" in args:
            return "help"
        if args == ["launch"]:
            return "main launch"
        return {"launch": "validated launch", "verify": "verify", "report": "report",
                "check-model": "check-model"}.get(args[0] if args else "", "")
    words = shlex.split(part)
    name = Path(words[0]).name if words else ""
    if name == "mlflow" and words[1:2] == ["ui"]:
        return "server"
    if name == "optuna-dashboard":
        return "server"
    if part.startswith(("echo ", "chmod ")) and "~/.pgpass" in part:
        return "pgpass"
    return ""


def test_docs_every_command_is_one_a_test_runs() -> None:
    unknown = [f"{c.where}: {p}" for c in COMMANDS for p in c.parts if not kind(p)]
    assert not unknown, "commands in the docs that no test runs (teach tests/test_docs_commands.py):\n" + "\n".join(
        unknown)
    assert sum(kind(p) == "main launch" for c in COMMANDS for p in c.parts) == 1  # one launch, reused


def test_docs_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    """The README's first two commands stay first and as they are; .ci/run runs the second (the set-up
    and the whole suite, this file included), so the set-up of the first is installed there too."""
    readme = [c for c in COMMANDS if c.where.startswith("README.md")]
    assert [c.text for c in readme[:2]] == [SETUP_MAIN, SETUP_TESTS]
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" && {TESTS}\n' in ci


def _each(*kinds: str) -> list[tuple[str, str]]:
    """(where, command) of every command of ``kinds``, each command text once."""
    seen: dict[str, str] = {}
    for c in COMMANDS:
        for p in c.parts:
            key = p.replace(".venv/bin/", "")
            if kind(p) in kinds and key not in seen:
                seen[key] = c.where
    return [(where, p) for p, where in seen.items()]


@pytest.mark.parametrize(("where", "part"), _each("help"))
def test_docs_help_command_runs(where: str, part: str) -> None:
    args = tuner_args(part)
    assert args is not None
    done = run_tuner(args, ROOT, timeout=120)
    assert done.returncode == 0 and "usage: python -m tuner" in done.stdout, (where, done.stderr[-2000:])


@pytest.mark.parametrize(("where", "part"), _each("validated launch"))
def test_docs_other_launch_command_is_valid(where: str, part: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed by tuner's parser and validated as a launch validates its flags and YAML first."""
    from tuner.cli import launch_flags, parser
    from tuner.config import load_launch

    monkeypatch.chdir(ROOT)
    args = parser().parse_args(tuner_args(part))
    config = load_launch(launch_flags(args), args.config)
    assert config.trials >= 1, where


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize(("where", "part"), _each("check-model"))
def test_docs_check_model_command_runs(where: str, part: str) -> None:
    args = tuner_args(part)
    assert args is not None
    done = run_tuner(args, ROOT, timeout=600)
    assert done.returncode == 0 and "all checks passed" in done.stdout, (where, done.stdout[-3000:],
                                                                         done.stderr[-2000:])


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job, run once in a temp folder with :data:`TINY` appended: its folder."""
    folder = tmp_path_factory.mktemp("readme_launch")
    (main,) = [tuner_args(p) for c in COMMANDS for p in c.parts if kind(p) == "main launch"]
    assert main is not None
    done = run_tuner([*main, *TINY], folder, timeout=900)
    assert done.returncode in FINISHED, done.stderr[-3000:]
    assert (folder / "best_config.yaml").is_file() and (folder / "tuner.db").is_file()
    assert (folder / "mlflow.db").is_file()
    return folder


@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.slow
def test_docs_main_launch_runs_and_says_where_to_look(launched: Path) -> None:
    assert list(launched.glob("*_stability_map.png"))  # the README's picture is one of these


@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize(("where", "part"), _each("verify", "report"))
def test_docs_verify_and_report_commands_run_on_the_launch(where: str, part: str, launched: Path) -> None:
    args = tuner_args(part)
    assert args is not None
    if args[0] == "verify":
        args = [*args, *VERIFY_TINY]
    done = run_tuner(args, launched, timeout=600)
    assert done.returncode in FINISHED, (where, done.stdout[-2000:], done.stderr[-2000:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Servers a test starts, each ended (its process group) when the test ends."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=20)


def _page(url: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> str:
    """The page at ``url`` once the server answers (it fails if the server exits first)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode("utf-8", "replace"))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.mark.ray
@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize(("where", "part"), _each("server"))
def test_docs_ui_command_serves_the_launch(where: str, part: str, launched: Path,
                                           server: list[subprocess.Popen[bytes]]) -> None:
    """``mlflow ui ...`` / ``optuna-dashboard ...`` as written, on a free port, in the launch's folder."""
    words = shlex.split(part)
    program = Path(sys.executable).parent / Path(words[0]).name
    port = _free_port()
    proc = subprocess.Popen([str(program), *words[1:], "--port", str(port)], cwd=launched,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    server.append(proc)
    if Path(words[0]).name == "mlflow":
        assert "<title>MLflow</title>" in _page(f"http://127.0.0.1:{port}/", proc), where
    else:
        assert "optuna" in _page(f"http://127.0.0.1:{port}/dashboard", proc).lower(), where


def test_docs_pgpass_line_writes_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    """The shell line of docs/operations.md, in a temp HOME (its launch is validated above)."""
    lines = [p for c in COMMANDS for p in c.parts if kind(p) == "pgpass"]
    assert lines
    subprocess.run(["bash", "-c", " && ".join(lines)], check=True, env={**os.environ, "HOME": str(tmp_path)})
    pgpass = tmp_path / ".pgpass"
    assert re.fullmatch(r"[^:\n]+:\d+:\w+:\w+:\S+\n", pgpass.read_text())
    assert stat.S_IMODE(pgpass.stat().st_mode) == 0o600
