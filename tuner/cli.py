"""Command line: ``python -m tuner launch | report | verify | check-model``.

Thin by design: one parser function per command; parsing is tested on its own; the work is done
in ``tuner.driver.launch`` / ``tuner.driver.report`` / ``tuner.worker.checkmodel``. A :class:`TunerError` is printed
as one clear message (no traceback) and the exit status is 2 (bad input), or 4 when every trial of
a launch failed. Passwords are masked in all output (``tuner.masking``). ``launch`` and ``verify`` exit 3
when the config they end with is not shown stable (it diverged, did not learn, or its verified
survival's lower bound is below ``--min-survival``). Exit 6: a file tuner writes (best_config.yaml,
a plot) could not be written, a full disk say; the earlier file is left whole (``tuner.atomic``),
the study is kept, and the same command (or ``tuner report`` for the plots) writes it again. A
message is capped at :data:`MAX_MESSAGE` characters, its head and tail kept around an ellipsis.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from tuner import environ, masking
from tuner.errors import Interrupted, TunerError

LAUNCH_FLAGS = (
    "model", "space", "trials", "steps", "seeds", "report_every", "study", "storage",
    "tracking_uri", "no_tracking", "address", "cpus_per_trial", "gpus_per_trial",
    "max_concurrent", "max_retries", "num_cpus", "num_gpus", "sampler", "seed", "out",
    "allow_bad_data", "live", "race_seeds", "verify_seeds", "verify_steps", "min_survival",
    "verify_candidates", "margin", "pruner", "graph_reuse",
    "grace_period", "placement_timeout", "allow_steps_change", "run_timeout",
)


def add_launch(sub: Any) -> None:
    """The ``launch`` command's flags (every default lives in tuner.config.LaunchConfig)."""
    from tuner.driver import pruning  # the one registry of pruner names (imports optuna, not TensorFlow)

    p = sub.add_parser("launch", help="run a stability search and write best_config.yaml",
                       description="Search for a training config that does not diverge.")
    p.add_argument("--config", help="launch YAML whose keys are these flags' names (flags win)")
    p.add_argument("--model", help="iterated_mlp (default), counting_cnn, pkg.module:Name or file.py:Name")
    p.add_argument("--space", help="search-space YAML (default: search_spaces/<model>.yaml)")
    p.add_argument("--trials", type=int,
                   help="finished trials the study should reach, counting those it already holds: a continued "
                        "study runs only the rest, so the same command twice trains once; raise it to run more "
                        "(default 30)")
    p.add_argument("--steps", type=int, help="training steps per seed run: the budget (default 600)")
    p.add_argument("--seeds", type=int, help="seeds per trial, run in parallel (default 2)")
    p.add_argument("--report-every", type=int, help="steps between progress records (default 25)")
    p.add_argument("--study", help="study name; the same name and storage continue a study (default: model name)")
    p.add_argument("--storage", help="Optuna storage URL; keep a password out of argv with $TUNER_STORAGE, "
                   "PGPASSWORD or ~/.pgpass (docs/operations.md) (default $TUNER_STORAGE or sqlite:///tuner.db)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--no-tracking", action="store_true", default=None, help="do not log to MLflow")
    p.add_argument("--address", help="join this Ray cluster (host:port or auto); default: start a local one")
    p.add_argument("--cpus-per-trial", type=float, help="CPUs of one seed run; its TF threads (default 1)")
    p.add_argument("--gpus-per-trial", type=float, help="GPUs of one seed run, fractions share a GPU (default 0)")
    p.add_argument("--max-concurrent", type=int, help="at most this many seed runs at once (default: what fits)")
    p.add_argument("--max-retries", type=int, help="retries of a seed run whose worker died (default 2)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the embedded local cluster (default: all)")
    p.add_argument("--num-gpus", type=int, help="GPUs of the embedded local cluster (default: detected)")
    p.add_argument("--sampler", choices=("tpe", "random"), help="Optuna sampler (default tpe)")
    p.add_argument("--seed", type=int, help="sampler seed, for a reproducible search (default 0)")
    p.add_argument("--out", help="where to write the best config (default best_config.yaml)")
    p.add_argument("--allow-bad-data", action="store_true", default=None,
                   help="skip samples the data preflight flags instead of stopping")
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                   help="live terminal view (default: on when stdout is a terminal; never when it is piped or "
                        "redirected: one line per event then)")
    p.add_argument("--race-seeds", type=int,
                   help="seeds a trial that could become the best must survive, doubling from --seeds; "
                        "at or below --seeds: no racing (default 8)")
    p.add_argument("--verify-seeds", type=int,
                   help="fresh seeds the best configs are retrained on at the end; 0: no verification (default 16)")
    p.add_argument("--verify-steps", type=int, help="steps of a verification run (default: 2 x --steps)")
    p.add_argument("--pruner", choices=pruning.NAMES, help=pruning.help_text())
    p.add_argument("--min-survival", type=float,
                   help="bar for the 95%% lower bound of the verified survival rate (default 0.8)")
    p.add_argument("--verify-candidates", type=int,
                   help="at most this many configs are verified, best first, until one meets the bar (default 3)")
    p.add_argument("--grace-period", type=int,
                   help="seconds without a heartbeat after which another launch's trial counts as stopped and "
                        "is run again; launches on one study share it (default 30)")
    p.add_argument("--placement-timeout", type=float,
                   help="seconds runs may wait with no alive node able to host them: then the embedded cluster is "
                        "restarted, or with --address the launch stops (exit 5) (default 120)")
    p.add_argument("--margin", action=argparse.BooleanOptionalAction, default=None,
                   help="measure the winner's learning-rate margin (x1.5, 2, 3, 5) on the verification seeds "
                        "(default: on)")
    p.add_argument("--run-timeout", type=float,
                   help="seconds a seed run may send no progress before its worker is killed and the run FAILED "
                        "(a hung build or step; the trial FAILs and is not queued again) (default: 10x the "
                        "longest such wait of this launch's runs, at least 120 s; 600 s before any run reported)")
    p.add_argument("--allow-steps-change", action="store_true", default=None,
                   help="continue a study that earlier launches searched at another --steps (refused without it: "
                        "their trials' losses are not comparable with this budget's); best_config.yaml records "
                        "every budget the study was searched at")
    p.add_argument("--graph-reuse", action=argparse.BooleanOptionalAction, default=None,
                   help="a worker reuses the graph it built for a model config, reseeded, for the next run of "
                        "that config; --no-graph-reuse builds every run's graph afresh, for a model whose "
                        "build is not deterministic (default: on)")


def add_report(sub: Any) -> None:
    """The ``report`` command: a finished study's table and plots, from its stores alone."""
    p = sub.add_parser("report", help="table and plots of a study, without training",
                       description="Print a study's trials and write its stability plots.")
    p.add_argument("--model", help="the launch's model, whose name is the default study name (default iterated_mlp)")
    p.add_argument("--study", help="study name (default: the model's name, as launch)")
    p.add_argument("--storage", help="Optuna storage URL (default $TUNER_STORAGE or sqlite:///tuner.db, as launch)")
    p.add_argument("--tracking-uri",
                   help="MLflow tracking URI: divergence causes, and the plots attached to the launch run "
                        "(default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db, as launch, if that file exists)")
    p.add_argument("--no-tracking", action="store_true", help="do not read or write MLflow")
    p.add_argument("--out-dir", default=".", help="folder for the PNG plots (default: current folder)")


def add_verify(sub: Any) -> None:
    """The ``verify`` command: retrain a config on fresh seeds; exit 0 only if it meets the bar."""
    p = sub.add_parser("verify", help="retrain a config on fresh seeds and bound its survival rate",
                       description="Retrain a config (best_config.yaml's shape) on fresh seeds; print "
                                   "'survived k/n' with a 95% Wilson lower bound; exit 0 if the bound "
                                   "reaches --min-survival, else 3. The file is data: a model it names "
                                   "from a .py file or a module is imported only if --model names it too, "
                                   "or with --trust-file-model.")
    p.add_argument("config", help="a YAML with a 'config:' mapping of knob values (best_config.yaml)")
    p.add_argument("--seeds", type=int, default=16,
                   help="fresh seeds to train on, 1 to 10000: each is one training run, and 10000/10000 "
                        "already bounds the rate above 0.9996 (default 16)")
    p.add_argument("--steps", type=int,
                   help="steps per run, 1 to 10 million (default: 2 x the file's stability.steps)")
    p.add_argument("--model",
                   help="model: iterated_mlp, counting_cnn, pkg.module:Name or file.py:Name (default: the "
                        "file's study.model, a file or module one only with --trust-file-model; else iterated_mlp)")
    p.add_argument("--trust-file-model", action="store_true",
                   help="import the .py file or module that the file's study.model names (without it, "
                        "tuner says which it would import and stops)")
    p.add_argument("--min-survival", type=float, default=0.8,
                   help="bar for the 95%% lower bound of the survival rate, 0 to 1 (default 0.8)")
    p.add_argument("--seed", type=int, help="derive the fresh seeds from this number (default: random)")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop at the first divergence that puts the bar out of reach")
    p.add_argument("--address", help="join this Ray cluster (host:port or auto); default: start a local one")
    p.add_argument("--num-cpus", type=int, help="CPUs of the embedded local cluster (default: all)")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs of one seed run (default 1)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs of one seed run (default 0)")


def add_check_model(sub: Any) -> None:
    """The ``check-model`` command: check a model against the contract."""
    p = sub.add_parser("check-model", help="build a model once, train a few steps, check the contract",
                       description="Check that a model follows tuner's model contract.")
    p.add_argument("spec", help="iterated_mlp, counting_cnn, pkg.module:Name or path/file.py:Name")
    p.add_argument("--steps", type=int, default=5, help="training steps to run, 1 to 10000 (default 5)")


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line (``tuner: error: ...``, exit 2) instead of the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tuner: error: {one_line(message)} (see {self.prog} --help)\n")


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

    masking.install()
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
