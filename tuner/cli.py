"""Command line: ``python -m tuner launch | report | verify | check-model``.

Thin by design: each command's flags are generated from its options model in ``tuner.config``
(:func:`add_options`: one definition of each option's name, type, default and help); parsing is
tested on its own; the work is done in ``tuner.driver.launch`` / ``tuner.driver.report`` /
``tuner.worker.checkmodel``. A :class:`TunerError` is printed as one clear message (no traceback)
and the exit status is 2 (bad input), or 4 when every trial of a launch failed. Passwords are
masked in all output (``tuner.masking``). ``launch`` and ``verify`` exit 3 when the config they
end with is not shown stable (it diverged, did not learn, or its verified survival's lower bound
is below ``--min-survival``). Exit 6: a file tuner writes (best_config.yaml, a plot) could not be
written, a full disk say; the earlier file is left whole (``tuner.atomic``), the study is kept,
and the same command (or ``tuner report`` for the plots) writes it again. A message is capped at
:data:`MAX_MESSAGE` characters, its head and tail kept around an ellipsis.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NoReturn

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tuner import environ, masking
from tuner.config import CheckModelOptions, LaunchConfig, ReportOptions, VerifyOptions
from tuner.errors import Interrupted, TunerError

LAUNCH_FLAGS = tuple(LaunchConfig.model_fields)  # every field of LaunchConfig is a launch flag


def add_options(p: argparse.ArgumentParser, model: type[BaseModel], *, given_only: bool = False,
                helps: Mapping[str, str] | None = None) -> None:
    """One argument per field of ``model`` (tuner.config), in the fields' order: ``--name-with-dashes``,
    or a positional argument for a field without a default; its type, choices (a ``Literal``), default
    and help (``description``, ``helps`` instead where given) are the field's. A ``bool`` is
    ``--flag`` when its default is False, else ``--flag/--no-flag``. ``given_only``: every default is
    None, so that what was not given can come from elsewhere (launch's YAML)."""
    for name, field in model.model_fields.items():
        names, kwargs = argument(name, field, given_only, (helps or {}).get(name))
        p.add_argument(*names, **kwargs)


def argument(name: str, field: FieldInfo, given_only: bool = False,
             help_text: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """The ``add_argument`` names and keywords of one field (see :func:`add_options`)."""
    text = help_text or field.description or ""
    kind = _without_none(field.annotation)
    if field.is_required():
        return [name], {"help": text.replace("%", "%%")}
    kwargs: dict[str, Any] = {"default": None if given_only else field.default,
                              "help": (text + default_shown(field, text)).replace("%", "%%")}
    if kind is bool:
        kwargs["action"] = "store_true" if field.default is False else argparse.BooleanOptionalAction
    elif typing.get_origin(kind) is Literal:
        kwargs["choices"] = typing.get_args(kind)
    elif kind in (int, float):
        kwargs["type"] = kind
    return ["--" + name.replace("_", "-")], kwargs


def default_shown(field: FieldInfo, text: str) -> str:
    """`` (default X)`` for a help ``text`` that does not state the field's default itself
    (``(default`` or ``default:`` in it); nothing for None or a False flag."""
    default = field.default
    if "(default" in text or "default:" in text or default is None or default is False:
        return ""
    if default is True:
        return " (default: on)"
    return f" (default {default:g})" if isinstance(default, float) else f" (default {default})"


def _without_none(annotation: Any) -> Any:
    """``int`` of ``int | None``; any other annotation as it is."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1 \
        else annotation


def add_launch(sub: Any) -> None:
    """The ``launch`` command: ``--config`` and a flag per field of LaunchConfig, each None unless given."""
    from tuner.driver import pruning  # the one registry of pruner names (imports optuna, not TensorFlow)

    p = sub.add_parser("launch", help="run a stability search and write best_config.yaml",
                       description="Search for a training config that does not diverge.")
    p.add_argument("--config", help="launch YAML whose keys are these flags' names (flags win)")
    add_options(p, LaunchConfig, given_only=True, helps={"pruner": pruning.help_text()})


def add_report(sub: Any) -> None:
    """The ``report`` command: a finished study's table and plots, from its stores alone."""
    p = sub.add_parser("report", help="table and plots of a study, without training",
                       description="Print a study's trials and write its stability plots.")
    add_options(p, ReportOptions)


def add_verify(sub: Any) -> None:
    """The ``verify`` command: retrain a config on fresh seeds; exit 0 only if it meets the bar."""
    p = sub.add_parser("verify", help="retrain a config on fresh seeds and bound its survival rate",
                       description="Retrain a config (best_config.yaml's shape) on fresh seeds; print "
                                   "'survived k/n' with a 95% Wilson lower bound; exit 0 if the bound "
                                   "reaches --min-survival, else 3. The file is data: a model it names "
                                   "from a .py file or a module is imported only if --model names it too, "
                                   "or with --trust-file-model.")
    add_options(p, VerifyOptions)


def add_check_model(sub: Any) -> None:
    """The ``check-model`` command: check a model against the contract."""
    p = sub.add_parser("check-model", help="build a model once, train a few steps, check the contract",
                       description="Check that a model follows tuner's model contract.")
    add_options(p, CheckModelOptions)


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line (``tuner: error: ...``, exit 2) instead of the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tuner: error: {one_line(message)} (see {self.prog} --help)\n")


STOP_LIMIT_S = 30.0  # a stop's cleanup ends within 10 s (test_fault_signals.py), or the process ends at once
MAX_MESSAGE = 600  # characters of a printed message: a YAML alias bomb's parser error was 392 KB


def one_line(text: str) -> str:
    """``text`` on one line, passwords masked (before it is cut), at most :data:`MAX_MESSAGE` long:
    a longer one keeps its head (what is wrong) and its tail (the fix) around `` ... ``."""
    text = masking.mask(" ".join(text.split()))
    if len(text) <= MAX_MESSAGE:
        return text
    tail = MAX_MESSAGE // 3
    return f"{text[:MAX_MESSAGE - tail - 5]} ... {text[-tail:]}"


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    root = OneLineParser(prog="python -m tuner", description="tuner: find a training config of a TensorFlow 1-style "
                         "model that does not diverge to NaN, and the evidence that it is stable.")
    sub = root.add_subparsers(dest="command", required=True)
    add_launch(sub)
    add_report(sub)
    add_verify(sub)
    add_check_model(sub)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, turn a TunerError into one line and its exit status (2: bad input).

    Every password of a storage or tracking URL is masked in whatever is printed (tuner.masking).
    """
    from tuner.config import environment_secrets
    from tuner.driver import signals

    masking.install()
    signals.exit_within(STOP_LIMIT_S)  # a stop signal ends the process even where the cleanup hangs
    environ.quiet_mlflow()  # no MLflow log lines: tuner says what failed
    masking.register_secrets(*environment_secrets())  # PGPASSWORD, MLFLOW_TRACKING_PASSWORD, $TUNER_STORAGE's, ...
    args = parser().parse_args(argv)
    masking.register(getattr(args, "storage", None), getattr(args, "tracking_uri", None))
    try:
        if args.command == "launch":
            return _launch(args)
        if args.command == "report":
            from tuner.driver.report import run_report

            return run_report(args)
        if args.command == "verify":
            from tuner.driver.verify import run_verify

            return run_verify(args)
        if args.command == "check-model":
            from tuner.worker.checkmodel import run_check

            return run_check(args)
    except TunerError as exc:
        kind = "tuner:" if isinstance(exc, Interrupted) else "tuner: error:"
        print(f"{kind} {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, SystemExit) as exc:  # a stop signal outside a launch's own handling
        from tuner.driver.signals import is_stop, stopped

        if not is_stop(exc):
            raise

        stop = stopped(exc)
        print(f"tuner: {'interrupted' if stop.name == 'Ctrl-C' else 'stopped by ' + stop.name}; run the same "
              "command again", file=sys.stderr)
        return stop.exit_code
    return 1


def launch_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The launch flags that were given (None means not given)."""
    return {name: getattr(args, name) for name in LAUNCH_FLAGS}


def _launch(args: argparse.Namespace) -> int:
    from tuner.config import load_launch
    from tuner.driver.export import is_success
    from tuner.driver.launch import launch

    config = load_launch(launch_flags(args), args.config)
    masking.register(config.storage, config.tracking_uri)
    doc = launch(config)
    return 0 if is_success(doc) else 3
