"""The MLflow UI and optuna-dashboard of a tiny launch, as a person sees them in a browser.

Runs a small launch (or reads the stores of one given with ``--store``), starts ``mlflow server``
and ``optuna-dashboard`` on 127.0.0.1 (free ports), opens their pages in a headless Chromium
(driven by Playwright, with the system's ``chromium``: Playwright's own browser download is not
needed), saves a PNG of each page to ``--out`` and checks the pages' text for what a person must
see there. Exit status 1 when a check fails (each check prints ok/FAIL with what it looked for).

    flock /tmp/tf.lock .venv/bin/python bench/ui_screenshots.py --out ui_shots
    .venv/bin/python bench/ui_screenshots.py --out ui_shots --store DIR  # DIR holds t.db, m.db

The pages: the experiment as it opens in a fresh browser, the runs table in the training views
(tuner's link, with the launch's trials unfolded), a diverged trial's run (description, tags), its
metric charts, the launch's plots, optuna-dashboard's study page (history and intermediate
values; a diverged trial has no value) and its trial list with a pruned trial's intermediate values and note.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STUDY = "ui"
# 6 trials of the default space at TPE seed 0: trial 3 diverges (both seeds, step 109 first), the
# others survive; trial 2 races to 4 seeds and diverges on a fresh verification seed
LAUNCH = ["--trials", "6", "--steps", "200", "--seeds", "2", "--race-seeds", "4", "--verify-seeds", "4",
          "--verify-candidates", "1", "--seed", "0", "--num-cpus", "2", "--study", STUDY]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WAIT_MS = 20_000


def find_chromium(given: str | None = None) -> str | None:
    """The Chromium binary to drive: ``given``, ``$TUNER_CHROMIUM`` or the first on PATH."""
    for name in (given, os.environ.get("TUNER_CHROMIUM"), *BROWSERS):
        if name and (path := shutil.which(name)):
            return path
    return None


@dataclass
class Checks:
    """What each page must show; printed as it goes."""

    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append((name, ok, detail))
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [name for name, ok, _ in self.results if not ok]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(command: list[str], health: str, log: Path, timeout: float = 90.0) -> Iterator[None]:
    """Run a server (in its own process group) until ``health`` answers; stop it on exit."""
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(health, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{health} did not answer in {timeout:.0f} s") from None
                time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_launch(store: Path) -> None:
    """A tiny launch writing t.db, m.db and the plots into ``store``."""
    args = [sys.executable, "-m", "tuner", "launch", *LAUNCH, "--storage", f"sqlite:///{store / 't.db'}",
            "--tracking-uri", f"sqlite:///{store / 'm.db'}", "--out", str(store / "best_config.yaml")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, cwd=store, env=env, capture_output=True, text=True, timeout=900)
    (store / "launch.log").write_text(done.stdout + done.stderr)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"the launch exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")


def body_has(page: Any, *texts: str, timeout_ms: int = WAIT_MS) -> list[str]:
    """The ``texts`` missing from the page's visible text once it settled (waits up to ``timeout_ms``)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        body = page.inner_text("body")
        missing = [t for t in texts if t not in body]
        if not missing or time.monotonic() > deadline:
            return missing
        page.wait_for_timeout(500)


def check_page(checks: Checks, page: Any, name: str, *texts: str, absent: tuple[str, ...] = ()) -> None:
    missing = body_has(page, *texts)
    checks.add(f"{name} shows {', '.join(map(repr, texts))}", not missing, f"missing {missing}")
    body = page.inner_text("body")
    for text in absent:
        checks.add(f"{name} does not show {text!r}", text not in body, "it does")


def shoot(page: Any, out: Path, name: str, full: bool = False) -> None:
    page.wait_for_timeout(1500)  # charts draw after their data arrives
    page.screenshot(path=str(out / f"{name}.png"), full_page=full)


@dataclass(frozen=True)
class MlflowFacts:
    """What the tracking store holds, to find the pages and the text they must show."""

    experiment_id: str
    launch_id: str
    diverged_id: str
    diverged_name: str
    description: str
    divergence_step: str
    plots: tuple[str, ...]


def mlflow_facts(uri: str) -> MlflowFacts:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(STUDY)
    if experiment is None:
        raise RuntimeError(f"{uri} has no experiment {STUDY!r}")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    launch = next(r for r in runs if r.data.tags.get("tuner.role") == "study")
    diverged = [r for r in runs if r.data.tags.get("status") == "diverged" and r.data.tags.get("phase") == "search"]
    if not diverged:
        raise RuntimeError("the launch has no diverged trial to look at")
    run = diverged[0]
    plots = tuple(a.path for a in client.list_artifacts(launch.info.run_id) if a.path.endswith(".png"))
    return MlflowFacts(experiment.experiment_id, launch.info.run_id, run.info.run_id, run.info.run_name,
                       run.data.tags.get("mlflow.note.content", ""), run.data.tags.get("divergence_step", "?"),
                       plots)


def mlflow_pages(checks: Checks, page: Any, base: str, facts: MlflowFacts, out: Path) -> None:
    from tuner.driver.mlflow_ui import runs_link

    exp = f"{base}/#/experiments/{facts.experiment_id}"
    page.goto(exp)
    check_page(checks, page, "experiment (fresh browser)", f"Trials of study {STUDY}:")
    shoot(page, out, "mlflow_1_experiment_fresh_browser")

    # the description's link (MLflow opens it in a new tab: followed here in the same page)
    link = page.locator(f'a[href*="{runs_link(facts.experiment_id)}"]')
    checks.add("the description links to the training views", link.count() > 0, "no such link")
    page.goto(f"{base}/{link.first.get_attribute('href') if link.count() else runs_link(facts.experiment_id)}")
    check_page(checks, page, "runs table", f"{STUDY}-launch", "status", "divergence_step", "learning_rate",
               "val_loss", "Description", absent=("Evaluation runs",))
    with contextlib.suppress(Exception):
        page.get_by_role("button", name="Hide banner").click(timeout=3000)
    expander = page.locator(".ag-row", has_text=f"{STUDY}-launch").locator("button").first
    expander.click(timeout=WAIT_MS)
    check_page(checks, page, "runs table, launch unfolded", facts.diverged_name, "survived", "diverged")
    shoot(page, out, "mlflow_2_runs_nested")

    run = f"{exp}/runs/{facts.diverged_id}"
    page.goto(f"{run}?workflowType=machine_learning")
    sentence = facts.description[:60]
    check_page(checks, page, "diverged run", "status", "diverged", "divergence_step", facts.divergence_step,
               sentence or "<a description>")
    checks.add("diverged run has a one-sentence description", facts.description.count(". ") == 0
               and facts.description.endswith(".") and "diverged at step" in facts.description, facts.description)
    shoot(page, out, "mlflow_3_diverged_run", full=True)

    page.goto(f"{run}/model-metrics?workflowType=machine_learning")
    check_page(checks, page, "diverged run's charts", "loss", "grad_norm", "diverged_at_step")
    shoot(page, out, "mlflow_4_diverged_metrics")

    checks.add("the launch run holds the plots", bool(facts.plots), "no .png artifact on the launch run")
    if facts.plots:
        page.goto(f"{exp}/runs/{facts.launch_id}/artifacts/{facts.plots[0]}?workflowType=machine_learning")
        check_page(checks, page, "launch artifacts", *facts.plots)
        page.wait_for_timeout(2000)
        shoot(page, out, "mlflow_5_plots")


def optuna_pages(checks: Checks, page: Any, base: str, storage: str, out: Path) -> None:
    import optuna

    from tuner.driver.trialrecord import read

    study = optuna.load_study(study_name=STUDY, storage=storage)
    study_id = study._study_id
    # PRUNED: diverged, or stopped by the pruner (whose value is its last training loss: Optuna's rule)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED
              and ((record := read(t)) is None or record.state.value == "diverged")]
    page.goto(f"{base}/dashboard/studies/{study_id}")
    check_page(checks, page, "optuna-dashboard study", "History", "Intermediate values", absent=("Objective 0",))
    shoot(page, out, "optuna_1_study", full=True)

    checks.add("diverged (PRUNED) trials have no value on the val_loss axis", all(t.value is None for t in pruned),
               str([t.value for t in pruned]))
    number = f"?numbers={pruned[0].number}" if pruned else ""
    page.goto(f"{base}/dashboard/studies/{study_id}/trials{number}")
    note = (f"Trial {pruned[0].number}: diverged at step",) if pruned else ()  # its note: tuner.driver.dashboard
    check_page(checks, page, "optuna-dashboard trials", "Pruned", "Complete", "Intermediate Values", *note)
    shoot(page, out, "optuna_2_trials")


def browse(checks: Checks, chromium: str, store: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    ml_port, dash_port = free_port(), free_port()
    ml_base, dash_base = f"http://127.0.0.1:{ml_port}", f"http://127.0.0.1:{dash_port}"
    bin_dir = Path(sys.executable).parent
    mlflow_cmd = [str(bin_dir / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{store / 'm.db'}",
                  "--host", "127.0.0.1", "--port", str(ml_port), "--workers", "1"]
    dash_cmd = [str(bin_dir / "optuna-dashboard"), f"sqlite:///{store / 't.db'}", "--host", "127.0.0.1",
                "--port", str(dash_port)]
    facts = mlflow_facts(f"sqlite:///{store / 'm.db'}")
    with serve(mlflow_cmd, f"{ml_base}/health", out / "mlflow_server.log"), \
            serve(dash_cmd, f"{dash_base}/api/studies", out / "optuna_dashboard.log"), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            # MLflow's assistant panel opens by itself on a first visit and covers a third of the page
            context.add_init_script("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1','true');"
                                    "localStorage.setItem('mlflow.assistant.panelOpen_v1','false');")
            page = context.new_page()
            mlflow_pages(checks, page, ml_base, facts, out)
            optuna_pages(checks, page, dash_base, f"sqlite:///{store / 't.db'}", out)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs and the servers' logs")
    parser.add_argument("--store", type=Path, help="a folder with t.db and m.db of a launch of study 'ui' "
                        "(default: run a tiny launch in a temporary folder)")
    parser.add_argument("--chromium", help="the Chromium binary (default: $TUNER_CHROMIUM or chromium on PATH)")
    args = parser.parse_args(argv)
    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("no chromium binary: install one (apt-get install chromium) or pass --chromium", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="tuner-ui-") as tmp:
        store = args.store or Path(tmp)
        if args.store is None:
            start = time.monotonic()
            run_launch(store)
            print(f"launch: {time.monotonic() - start:.0f} s", flush=True)
        browse(checks, chromium, store.resolve(), args.out.resolve())
    print(f"{len(checks.results) - len(checks.failed)}/{len(checks.results)} checks passed; "
          f"screenshots in {args.out}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
