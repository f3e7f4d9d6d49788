"""Shared pieces of the benchmarks: machine facts, tables, medians, and the runs a search did.

A *run* here is one seed run as plain JSON data, so it can cross between processes (the tuner's
driver, Ray Tune's driver, the bare loop)::

    {"config": {...flat TrainConfig...}, "seed": 0, "steps": 300, "report_every": 25,
     "stop": 137, "status": "diverged"}

``stop`` is the step at which the tool's run ended (its divergence step, the report step at which
it was cancelled, or the budget); the bare loop trains the same config and seed up to there.

The benchmark scripts run each measured system in its own subprocess (``run_part``): a fresh
process per system, as a user would have, and no TensorFlow in a driver.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODEL = "iterated_mlp"
QUIET_LOAD = 0.5  # 1-minute load average under which a machine counts as quiet


def machine() -> dict[str, str]:
    """The machine and the versions that the figures depend on (TensorFlow is not imported)."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {name: _version(name) for name in ("tensorflow", "ray", "optuna", "mlflow")}
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        **versions,
    }


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def print_header(title: str) -> None:
    """Title, machine, versions and the load now (figures taken above QUIET_LOAD are suspect)."""
    info = machine()
    load = load_average()
    print(f"== {title}")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    note = "quiet" if load < QUIET_LOAD else "UNDER LOAD: timings are contaminated"
    print(f"load average (1 min) at start: {load:.2f} ({note})")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain text table, columns right-aligned except the first."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(parts))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value: Any) -> str:
    """Numbers with 3 significant digits (2 decimals at least for ratios), the rest as str."""
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:.3g}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return str(value)


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


def python_locked(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGV`` with the repository importable and TensorFlow's logs quiet, under
    ``flock $BENCH_LOCK`` where that is set (a machine shared with tests); output captured as text."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    lock = ["flock", os.environ["BENCH_LOCK"]] if os.environ.get("BENCH_LOCK") else []
    return subprocess.run([*lock, sys.executable, *argv], env=env, capture_output=True, text=True, **kwargs)


def run_part(script: str, args: Sequence[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``bench/<script> ARGS --json FILE`` in a fresh process; return what it wrote to FILE."""
    with tempfile.TemporaryDirectory(prefix="tuner-bench-") as tmp:
        out = Path(tmp) / "part.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(
            [sys.executable, str(BENCH / script), *args, "--json", str(out)],
            env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp,
        )
        if done.returncode != 0 or not out.exists():
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
            raise RuntimeError(f"bench/{script} {' '.join(args)} exited {done.returncode}")
        return json.loads(out.read_text())


def search_parser(doc: str | None, trials: int, steps: int, repeats: bool = True) -> argparse.ArgumentParser:
    """The options every search benchmark takes (trials, steps, seeds, report interval, sampler seed,
    --smoke, --json, and --repeats where it repeats); a script adds its own."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    if repeats:
        p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--trials", type=int, default=trials)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--report-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (the same in every repeat)")
    p.add_argument("--space", help="a search space YAML (default: the model's shipped space)")
    p.add_argument("--json", help="write the figures here")
    return p


def search_argv(args: argparse.Namespace) -> list[str]:
    """``args``'s search options as a command line, for a part run in its own process."""
    space = ["--space", str(Path(args.space).resolve())] if args.space else []
    return ["--trials", str(args.trials), "--steps", str(args.steps), "--seeds", str(args.seeds),
            "--report-every", str(args.report_every), "--seed", str(args.seed), *space]


def model_spec(spec: str) -> str:
    """``--model`` for a launch run in another folder: a ``path/to/file.py:Name`` made absolute, any
    other spec (a built-in name, ``package.module:Name``) as it is."""
    path, colon, name = spec.rpartition(":")
    return f"{os.path.abspath(path)}:{name}" if colon and os.path.isfile(path) else spec


def write_json(path: str | None, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` to ``path`` (a part's result for the script that started it)."""
    if path:
        Path(path).write_text(json.dumps(doc))


def train_config(flat: Mapping[str, Any]) -> Any:
    """A TrainConfig from its flat form (``TrainConfig.flat()``)."""
    from tuner.spaces import config_from_flat

    return config_from_flat(flat)


def run_key(run: Mapping[str, Any]) -> str:
    """What makes two runs the same work: config, seed, budget, report interval and stop step."""
    return json.dumps([run["config"], run["seed"], run["steps"], run["report_every"], run["stop"]], sort_keys=True)


def runs_from_study(study: Any, steps: int, report_every: int) -> list[dict[str, Any]]:
    """The seed runs of a finished tuner study, read back from its trials' records
    (``tuner.driver.trialrecord``): per seed its status and the step it stopped at (a diverged seed ran
    its divergence step, one step past the steps it survived; a cancelled one stopped at a report step).
    """
    from tuner.driver.trialrecord import SeedStatus, read

    runs = []
    for trial in study.get_trials(deepcopy=False):
        record = read(trial)
        if record is None:
            continue
        for seed in record.seeds:
            status = {SeedStatus.DIVERGED: "diverged", SeedStatus.CANCELLED: "cancelled"}.get(
                seed.status, record.state.value)
            stop = seed.steps_survived + 1 if seed.status is SeedStatus.DIVERGED else seed.steps_survived
            runs.append({"config": dict(record.config), "seed": seed.seed, "steps": steps,
                         "report_every": report_every, "stop": stop, "status": status,
                         "trial": trial.number})
    return runs


def pre_create_stores(storage: str, tracking_uri: str | None) -> None:
    """Create the Optuna and MLflow SQLite schemas, as any launch after a machine's first finds them."""
    import optuna

    optuna.storages.RDBStorage(storage)
    if tracking_uri:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking_uri).search_experiments()


def import_driver() -> None:
    """Import what a tuner driver imports, so that a timed launch measures the launch, not imports."""
    import importlib

    for name in ("matplotlib.figure", "mlflow.tracking", "optuna"):
        importlib.import_module(name)
    for name in ("executor", "export", "launch", "plots", "progress", "report", "search", "tracking"):
        importlib.import_module(f"tuner.driver.{name}")


def launch_config(tmp: str | Path, **values: Any) -> Any:
    """A LaunchConfig for a benchmark launch: stores and output in ``tmp``, no live view.

    The search alone, as these benchmarks measured it before racing, verification and the pruner
    existed (no racing, no verification, no margin, no pruner), unless ``values`` say otherwise:
    bench/robustness.py measures what those cost.
    """
    from tuner.config import LaunchConfig

    tracking = not values.pop("no_tracking", False)
    base: dict[str, Any] = {
        "model": MODEL, "storage": f"sqlite:///{tmp}/optuna.db", "out": f"{tmp}/best_config.yaml",
        "tracking_uri": f"sqlite:///{tmp}/mlflow.db" if tracking else None, "no_tracking": not tracking,
        "live": False, "race_seeds": 0, "verify_seeds": 0, "margin": False, "pruner": "none",
    }
    return LaunchConfig(**{**base, **values})


def timed_launch(config: Any) -> float:
    """Run ``tuner.driver.launch.launch(config)`` with its terminal output discarded; its wall time."""
    import contextlib
    import io

    from tuner.driver.launch import launch

    pre_create_stores(config.storage, config.tracking_uri)
    with contextlib.redirect_stdout(io.StringIO()):
        started = time.perf_counter()
        launch(config)
        return time.perf_counter() - started


@contextlib.contextmanager
def search_launch(args: argparse.Namespace, prefix: str, **values: Any) -> Iterator[tuple[float, Any]]:
    """A timed launch of ``args``' search options (and ``values``) in a temporary folder.

    Yields its wall time and its study while the folder and its stores still exist. Call
    ``import_driver`` first when the time spent around it is measured too.
    """
    import_driver()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        config = launch_config(tmp, trials=args.trials, steps=args.steps, seeds=args.seeds,
                               report_every=args.report_every, seed=args.seed, space=args.space, **values)
        wall = timed_launch(config)
        yield wall, load_study(config)


def load_study(config: Any) -> Any:
    """The study a launch wrote."""
    import optuna

    return optuna.load_study(study_name=config.study_name, storage=config.storage)


@contextlib.contextmanager
def slot_clock(slots: int) -> Iterator[dict[str, float]]:
    """Where a launch's slot time goes, from the events every ``RayExecutor`` tells while in the block
    (``tuner.driver.executor.listening``).

    Fills the yielded dict on exit, in seconds from the executor's creation: ``ready`` (the last
    worker has imported TensorFlow), ``end`` (the last run's final record), and in slot seconds
    from ``ready`` to ``end``: ``busy`` (a run dispatched and not yet ended), ``wasted`` (runs
    cancelled before their first step after they were dispatched: a sibling that was still
    building its graph when another seed diverged) and ``idle`` (no run on the slot).
    """
    from tuner.driver import executor as ex

    marks: dict[str, Any] = {"start": None, "ready": [], "dispatched": {}, "ended": []}

    def listen(event: str, item: Any) -> None:
        now = time.perf_counter()
        if event == "created":
            marks["start"] = now
        elif event == "worker_ready":
            marks["ready"].append(now)
        elif event == "dispatched":
            marks["dispatched"][(item.trial, item.seed)] = now  # a retry's dispatch replaces
        elif event == "record" and item.final:
            marks["ended"].append((item.trial, item.seed, item.step, item.status.value, now))

    figures: dict[str, float] = {}
    with ex.listening(listen):
        yield figures
    start, ready = marks["start"], max(marks["ready"], default=float("nan"))
    end = max((e[-1] for e in marks["ended"]), default=float("nan"))
    busy = wasted = 0.0
    for trial, seed, step, status, at in marks["ended"]:
        since = marks["dispatched"].get((trial, seed))
        if since is None:
            continue  # cancelled while queued: never held a slot
        busy += at - since
        if step == 0 and status == "cancelled":
            wasted += at - since
    figures.update(ready=ready - start, end=end - start, busy=busy, wasted=wasted,
                   idle=slots * (end - ready) - busy)
