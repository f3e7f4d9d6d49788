"""The MLflow UI and optuna-dashboard of a tiny launch, as a person sees them in a browser.

Runs a small launch (or reads the stores of one given with ``--store``), starts ``mlflow server``
and ``optuna-dashboard`` on 127.0.0.1 (free ports), and opens, in a headless Chromium with a fresh
profile (driven by Playwright, with the system's ``chromium``: Playwright's own browser download is
not needed), the URLs the launch printed (their host and port swapped for the servers' own) and the
links a person follows from there. It saves a PNG of each page to ``--out`` and checks the pages'
text for what a person must see there. Exit status 1 when a check fails (each check prints ok/FAIL
with what it looked for). ``--docs DIR`` also writes the two pictures of the README
(``mlflow_training_view.png``, ``optuna_dashboard.png``).

    flock /tmp/tuner-heavy.lock .venv/bin/python bench/ui_screenshots.py --out ui_shots
    .venv/bin/python bench/ui_screenshots.py --out ui_shots --store DIR  # DIR holds t.db, m.db, launch.log

What is checked, page by page (see tuner.driver.mlflow_ui for why MLflow shows what it shows):

- MLflow's experiment list: the study's description starts in plain words with the exported trial.
- The trials table (the printed link, else the description's): the training view, one row per
  trial without unfolding anything, tuner's columns, the exported run named ``..., exported``
  with ``chosen`` = true; the banner MLflow puts on a shared view, and that after "Override saved
  view" the plain runs page keeps tuner's columns with no banner.
- The exported run (the printed link): its description says what the export rests on.
- A diverged run: its description and divergence step; its loss chart, titled with the run's name
  (``diverged@<step>``).
- The launch run's description names the exported trial.
- optuna-dashboard (the printed link): the exported trial's note; the study page's note names the
  exported trial; no trial the pruner stopped has a value (none is drawn on the val_loss axis); no
  trial holds a switched-off knob's value.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
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
# 8 trials of the default space at TPE seed 2 (the first-seed pruner): 3 survive, 2 diverge, 3 are
# stopped by the pruner; the best raced trial is verified on 4 fresh seeds
LAUNCH = ["--trials", "8", "--steps", "200", "--seeds", "2", "--race-seeds", "4", "--verify-seeds", "4",
          "--verify-candidates", "1", "--seed", "2", "--num-cpus", "2", "--study", STUDY]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WAIT_MS = 20_000
VIEWPORT = {"width": 1440, "height": 900}
DOCS = {"mlflow": "mlflow_training_view.png", "optuna": "optuna_dashboard.png"}


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
    """A tiny launch writing t.db, m.db, the plots and its output (launch.log) into ``store``."""
    args = [sys.executable, "-m", "tuner", "launch", *LAUNCH, "--storage", f"sqlite:///{store / 't.db'}",
            "--tracking-uri", f"sqlite:///{store / 'm.db'}", "--out", str(store / "best_config.yaml")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run(args, cwd=store, env=env, capture_output=True, text=True, timeout=900)
    (store / "launch.log").write_text(done.stdout + done.stderr)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"the launch exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")


def printed_urls(log: str) -> list[str]:
    """Every http(s) URL the launch printed, in order."""
    return re.findall(r"https?://[^\s'\"<>]+", log)


def served(url: str, base: str) -> str:
    """``url`` with its scheme, host and port replaced by ``base``'s (the printed default ports)."""
    return re.sub(r"^https?://[^/]+", base, url)


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


def shoot(page: Any, out: Path, name: str, full: bool = False) -> Path:
    page.wait_for_timeout(1500)  # charts draw after their data arrives
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=full)
    return path


@dataclass(frozen=True)
class MlflowFacts:
    """What the tracking store holds, to find the pages and the text they must show."""

    experiment_id: str
    launch_id: str
    launch_note: str
    experiment_note: str
    trials: tuple[str, ...]  # the trials' run names
    chosen: tuple[str, ...]  # the run names tagged chosen = true
    diverged_id: str | None
    diverged_name: str
    diverged_note: str
    divergence_step: str


def mlflow_facts(uri: str) -> MlflowFacts:
    from mlflow.tracking import MlflowClient

    from tuner.driver.mlflow_ui import CHOSEN_TAG, NOTE_TAG

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(STUDY)
    if experiment is None:
        raise RuntimeError(f"{uri} has no experiment {STUDY!r}")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    launch = next(r for r in runs if r.data.tags.get("tuner.role") == "study")
    trials = [r for r in runs if r.data.tags.get("phase") == "search"]
    diverged = [r for r in trials if r.data.tags.get("status") == "diverged"]
    run = diverged[0] if diverged else None
    return MlflowFacts(
        experiment.experiment_id, launch.info.run_id, launch.data.tags.get(NOTE_TAG, ""),
        experiment.tags.get(NOTE_TAG, ""), tuple(r.info.run_name for r in trials),
        tuple(r.info.run_name for r in trials if r.data.tags.get(CHOSEN_TAG) == "true"),
        run.info.run_id if run else None, run.info.run_name if run else "",
        run.data.tags.get(NOTE_TAG, "") if run else "", run.data.tags.get("divergence_step", "?") if run else "?")


def row_text(page: Any, name: str) -> str:
    """The text of the runs table's row of run ``name``: its cells in the grid's pinned and centre parts."""
    pinned = page.locator(".ag-row", has_text=name)
    if not pinned.count():
        return ""
    index = pinned.first.get_attribute("row-index")
    return " ".join(page.locator(f'.ag-row[row-index="{index}"]').all_inner_texts())


def follow(page: Any, link: Any) -> Any:
    """Click ``link`` as a person would; the page it opened (a new tab, or the same page)."""
    with contextlib.suppress(Exception):  # GenAI's first-visit "Detect Issues" tip covers the page until closed
        page.get_by_role("button", name="Got it").click(timeout=3000)
    if link.get_attribute("target") == "_blank":
        with page.context.expect_page() as opened:
            link.click()
        page = opened.value
    else:
        link.click()
    page.wait_for_load_state()
    return page


def trials_table(checks: Checks, page: Any, facts: MlflowFacts, out: Path, docs: Path | None, name: str) -> None:
    """The trials table: the training view, one row per trial, tuner's columns, the export marked."""
    check_page(checks, page, name, "Model training", *facts.trials, "chosen", "status", "val_loss",
               "why_not_chosen", "learning_rate", absent=("Evaluation runs", f"{STUDY}-launch"))
    rows = page.locator(".ag-center-cols-container .ag-row").count()
    checks.add(f"{name}: one row per trial, none folded ({len(facts.trials)})", rows == len(facts.trials),
               f"{rows} rows")
    checks.add(f"{name}: the exported run's row says chosen = true",
               "true" in row_text(page, facts.chosen[0] if facts.chosen else "exported"), "no row, or no 'true'")
    banner = "You're viewing a shared view" in page.inner_text("body")
    print(f"note: MLflow shows its shared-view banner over the trials table: {banner}", flush=True)
    shot = shoot(page, out, "mlflow_2_trials_table")
    if docs is not None:
        shutil.copyfile(shot, docs / DOCS["mlflow"])


def mlflow_pages(checks: Checks, page: Any, base: str, facts: MlflowFacts, urls: list[str], out: Path,
                 docs: Path | None) -> None:
    from tuner.driver.mlflow_ui import EXPORTED, runs_link

    exp = f"{base}/#/experiments/{facts.experiment_id}"
    page.goto(f"{base}/#/experiments")
    check_page(checks, page, "experiment list", f"tuner study {STUDY}: trial", absent=("<!--",))
    shoot(page, out, "mlflow_0_experiment_list")
    checks.add("one trial's run is tagged chosen, named '..., exported'",
               len(facts.chosen) == 1 and facts.chosen[0].endswith(EXPORTED), str(facts.chosen))

    page.goto(exp)  # where a click on the experiment lands in a fresh browser: MLflow's GenAI overview
    check_page(checks, page, "experiment (fresh browser)", f"tuner study {STUDY}:", "Open the trials table")
    shoot(page, out, "mlflow_1_experiment_fresh_browser")
    link = page.locator(f'a[href*="{runs_link(facts.experiment_id)}"]')
    checks.add("the description links to the trials table", link.count() > 0, "no such link")

    if link.count():  # a person clicks it (MLflow may open it in a new tab)
        page = follow(page, link.first)
        trials_table(checks, page, facts, out, docs, "trials table (the description's link)")
    table = next((u for u in urls if "viewStateShareKey=" in u), None)  # a printed trials-table link
    if table is not None:
        page.goto(served(table, base))
        trials_table(checks, page, facts, out, docs, "trials table (the printed link)")
    with contextlib.suppress(Exception):
        page.get_by_role("button", name="Override saved view").click(timeout=3000)
        page.wait_for_timeout(1000)
        page.goto(f"{exp}/runs?workflowType=machine_learning")
        check_page(checks, page, "runs page after 'Override saved view'", "chosen", "why_not_chosen",
                   absent=("You're viewing a shared view",))

    for url in (u for u in urls if "/runs/" in u):  # the printed link to the exported run
        page.goto(served(url, base))
        check_page(checks, page, "exported run (printed link)", EXPORTED.strip(", "), "is exported (best_config.yaml)")
        shoot(page, out, "mlflow_3_exported_run", full=True)

    page.goto(f"{exp}/runs/{facts.launch_id}?workflowType=machine_learning")
    check_page(checks, page, "launch run", "is exported (best_config.yaml)")
    checks.add("the launch run's description names the exported trial", "is exported" in facts.launch_note,
               facts.launch_note)

    if facts.diverged_id is None:
        checks.add("the launch has a diverged trial to look at", False, "none diverged")
        return
    run = f"{exp}/runs/{facts.diverged_id}"
    page.goto(f"{run}?workflowType=machine_learning")
    check_page(checks, page, "diverged run", "diverged", facts.divergence_step, facts.diverged_note[:60])
    shoot(page, out, "mlflow_4_diverged_run", full=True)
    page.goto(f"{run}/model-metrics?workflowType=machine_learning")
    with contextlib.suppress(Exception):
        page.get_by_placeholder("Search metric charts").fill("loss", timeout=WAIT_MS)
    check_page(checks, page, "diverged run's loss chart", f"{facts.diverged_name} (s0/loss)",
               f"diverged@{facts.divergence_step}")
    shoot(page, out, "mlflow_5_diverged_loss_chart")


def optuna_pages(checks: Checks, page: Any, base: str, storage: str, urls: list[str], out: Path,
                 docs: Path | None) -> None:
    import optuna

    from tuner.driver.export import best_trial
    from tuner.driver.trialrecord import read
    from tuner.records import TrialState

    study = optuna.load_study(study_name=STUDY, storage=storage)
    found = best_trial(study)
    exported = found[0].number if found else -1
    stopped = [t for t in study.trials if (r := read(t)) is not None and r.state is TrialState.STOPPED]
    checks.add("trials the pruner stopped have no value (nothing on the val_loss axis)",
               all(t.value is None for t in stopped), str([(t.number, t.value) for t in stopped]))
    off = [(t.number, k) for t in study.trials for k, v in t.params.items()
           if k.startswith("use_") and v is False and k.removeprefix("use_") in t.params]
    checks.add("no trial holds a value for a switched-off knob", not off, str(off))

    page.goto(f"{base}/dashboard/studies/{study._study_id}")
    check_page(checks, page, "optuna-dashboard study page", "History", "Best Trial", "Study User Attributes",
               "exported (best_config.yaml)", f"trial {exported}: ")
    best = study.best_trial.number if any(t.value is not None for t in study.trials) else None
    print(f"note: optuna-dashboard's 'Best Trial' is trial {best}; the exported trial is {exported}", flush=True)
    shoot(page, out, "optuna_1_study_full", full=True)
    page.goto(f"{base}/dashboard/studies/{study._study_id}/note")  # the study's note (the left bar's note icon)
    check_page(checks, page, "optuna-dashboard study note", f"Exported by tuner: trial {exported}")
    shoot(page, out, "optuna_2_study_note")
    for url in (u for u in urls if "/dashboard/" in u):  # the printed link to the exported trial
        page.goto(served(url, base))
        check_page(checks, page, "optuna-dashboard trial (printed link)", f"Trial {exported}:", "exported")
        shot = shoot(page, out, "optuna_3_exported_trial")
        if docs is not None:
            shutil.copyfile(shot, docs / DOCS["optuna"])


def browse(checks: Checks, chromium: str, store: Path, out: Path, docs: Path | None) -> None:
    from playwright.sync_api import sync_playwright

    ml_port, dash_port = free_port(), free_port()
    ml_base, dash_base = f"http://127.0.0.1:{ml_port}", f"http://127.0.0.1:{dash_port}"
    bin_dir = Path(sys.executable).parent
    mlflow_cmd = [str(bin_dir / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{store / 'm.db'}",
                  "--host", "127.0.0.1", "--port", str(ml_port), "--workers", "1"]
    dash_cmd = [str(bin_dir / "optuna-dashboard"), f"sqlite:///{store / 't.db'}", "--host", "127.0.0.1",
                "--port", str(dash_port)]
    facts = mlflow_facts(f"sqlite:///{store / 'm.db'}")
    urls = printed_urls((store / "launch.log").read_text()) if (store / "launch.log").is_file() else []
    print(f"printed URLs: {urls}", flush=True)
    with serve(mlflow_cmd, f"{ml_base}/health", out / "mlflow_server.log"), \
            serve(dash_cmd, f"{dash_base}/api/studies", out / "optuna_dashboard.log"), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport=VIEWPORT)  # a fresh profile: nothing saved
            # MLflow's assistant panel opens by itself on a first visit and covers a third of the page
            context.add_init_script("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1','true');"
                                    "localStorage.setItem('mlflow.assistant.panelOpen_v1','false');")
            page = context.new_page()
            mlflow_pages(checks, page, ml_base, facts, [u for u in urls if ":5000" in u], out, docs)
            optuna_pages(checks, page, dash_base, f"sqlite:///{store / 't.db'}", [u for u in urls if ":8080" in u],
                         out, docs)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs and the servers' logs")
    parser.add_argument("--store", type=Path, help="a folder with t.db, m.db and launch.log of a launch of study "
                        "'ui' (default: run a tiny launch in a temporary folder)")
    parser.add_argument("--docs", type=Path, help=f"also write {' and '.join(DOCS.values())} here")
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
        browse(checks, chromium, store.resolve(), args.out.resolve(), args.docs.resolve() if args.docs else None)
    print(f"{len(checks.results) - len(checks.failed)}/{len(checks.results)} checks passed; "
          f"screenshots in {args.out}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
