"""tuner from a notebook, on a real Jupyter kernel of this interpreter (real Ray, SQLite, MLflow, TF).

``examples/quickstart.ipynb`` is run top to bottom (nbclient) in a temporary folder and its outputs
are checked: the launch's progress lines, the answer, the tables, the figures shown inline, the
study read back, the fresh-seed verification, and a model class defined in a cell and shipped to
the workers by value. A kernel interrupt (what Jupyter's stop button sends: SIGINT to the kernel's
process group) during ``tuner.launch`` must leave the study as the terminal's Ctrl-C does
(tests/test_fault_matrix.py): ``tuner.Interrupted`` in the cell, nothing RUNNING, the stopped trials
FAIL and queued again, no Ray process left, and the kernel still usable.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import optuna
import pytest
import yaml
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from nbclient import NotebookClient

from tests.conftest import ROOT, training

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.tf]

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
KERNEL = "python3"  # ipykernel's own spec: its argv "python" is run as this interpreter (sys.executable)


@pytest.fixture
def kernel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel imports this checkout's tuner even where it is not installed (kernels inherit the env)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def _cell(nb: Any, source_part: str) -> Any:
    """The one code cell whose source contains ``source_part``."""
    cells = [c for c in nb.cells if c.cell_type == "code" and source_part in c.source]
    assert len(cells) == 1, source_part
    return cells[0]


def _result(cell: Any) -> dict[str, Any]:
    """The data of the cell's execute_result (what its last expression displays)."""
    results = [o.data for o in cell.outputs if o.output_type == "execute_result"]
    assert len(results) == 1, cell.outputs
    return dict(results[0])


def _shown(cell: Any) -> str:
    """Everything the cell printed or displayed, as plain text."""
    texts = [o.text if o.output_type == "stream" else o.get("data", {}).get("text/plain", "") for o in cell.outputs]
    return "\n".join(texts)


def test_notebook_quickstart_runs_top_to_bottom_on_a_kernel(tmp_path: Path, kernel_env: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert not [c for c in nb.cells if c.cell_type == "code" and c.outputs]  # stored without outputs
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nsys.executable"))
    NotebookClient(nb, kernel_name=KERNEL, timeout=600, resources={"metadata": {"path": str(tmp_path)}}).execute()

    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert _result(nb.cells[-1])["text/plain"] == repr(sys.executable)  # the kernel ran this interpreter
    launched = _shown(_cell(nb, 'tuner.launch("iterated_mlp"'))
    assert re.search(r"^\[1/4 .*\] trial \d: ", launched, re.M), launched[-3000:]  # a progress line per trial
    assert "best config: trial " in launched
    shown_result = _result(next(c for c in nb.cells if c.source == "result"))["text/plain"]
    assert shown_result.startswith("<tuner.Result study='quickstart' trials=4: trial "), shown_result
    assert _result(_cell(nb, "written == result.answer.to_dict()"))["text/plain"] == "True"
    table = _result(_cell(nb, "result.trials_dataframe()"))
    assert "<table" in table["text/html"] and "params_learning_rate" in table["text/html"]
    assert "seed_state" in _result(_cell(nb, "trials_dataframe(seeds=True)"))["text/html"]
    for plot in ("result.plot_stability_map()", "result.plot_survival()"):
        assert "image/png" in _result(_cell(nb, plot)), plot  # the Figure is shown inline
    assert _result(_cell(nb, "tuner.load("))["text/plain"].startswith("(True,")  # load's answer is launch's
    assert re.fullmatch(r"'survived [0-4]/4 \(rate .*\)'", _result(_cell(nb, "tuner.verify("))["text/plain"])

    import tuner

    monkeypatch.chdir(tmp_path)  # the study's URLs as the notebook gave them (best_config.yaml records them)
    storage, tracking = "sqlite:///quickstart.db", "sqlite:///quickstart_mlflow.db"
    answer = tuner.load("quickstart", storage, tracking).answer
    assert answer is not None and answer.study.trial is not None
    assert yaml.safe_load(Path("quickstart_best.yaml").read_text()) == answer.to_dict()
    # the class defined in a cell: its workers unpickled it (else every trial FAILs with a ModelError)
    guarded = tuner.load("quickstart_guarded", storage, tracking)
    assert guarded.answer is not None and guarded.answer.study.model == "object:GuardedMLP"
    assert len(guarded.trials) == 2 and all(t.state.value in ("survived", "diverged") for t in guarded.trials)
    assert all(t.config["epsilon"] is not None and t.config["max_iter"] <= 6 for t in guarded.trials)
    assert "<table" in _result(_cell(nb, "mine.trials_dataframe()"))["text/html"]


LONG_LAUNCH = """import os, tuner
print("kernel pid", os.getpid())
tuner.launch("iterated_mlp", trials=6, steps=2000, seeds=1, report_every=100, race_seeds=0, verify_seeds=0,
             num_cpus=2, study="s1", storage="sqlite:///t.db", tracking_uri="sqlite:///m.db", out="best.yaml")
"""


@pytest.fixture
def kernel(tmp_path: Path, kernel_env: None) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A real kernel of this interpreter, working in ``tmp_path``."""
    km, kc = start_new_kernel(kernel_name=KERNEL, cwd=str(tmp_path))
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_notebook_kernel_interrupt_during_launch_raises_interrupted_and_leaves_the_study_clean(
    tmp_path: Path, kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    from mlflow.tracking import MlflowClient

    km, kc = kernel
    storage = f"sqlite:///{tmp_path / 't.db'}"
    msg_id = kc.execute(LONG_LAUNCH)
    deadline = time.monotonic() + 240
    while not training(storage):  # a trial is running and has reported a step: training is in flight
        assert time.monotonic() < deadline and km.is_alive()
        time.sleep(0.2)
    km.interrupt_kernel()  # the notebook's stop button: SIGINT to the kernel's process group
    reply = kc.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "Interrupted", reply["content"]
    said = reply["content"]["evalue"]
    assert said.startswith("interrupted: study 's1' keeps its ") and "call tuner.launch with the same arguments" in said
    shown = _iopub(kc, msg_id)
    assert [m["content"]["ename"] for m in shown if m["msg_type"] == "error"] == ["Interrupted"]
    printed = "".join(m["content"]["text"] for m in shown if m["msg_type"] == "stream")
    pid = re.search(r"^kernel pid (\d+)$", printed, re.M)
    assert pid, printed

    trials = optuna.load_study(study_name="s1", storage=storage).trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    stopped = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert stopped and all(t.user_attrs["reason"] == "interrupted (Ctrl-C)" for t in stopped)
    queued = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert sorted(t.user_attrs["rerun_of"] for t in queued) == [t.number for t in stopped]
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s1").experiment_id])
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags.get("tuner.role") == "study"][-1:] == ["KILLED"]
    assert not _left_beside(int(pid.group(1)))  # the embedded Ray cluster is gone with the launch; the kernel stays

    # the kernel is still usable, and the stopped study reads back
    out: list[str] = []
    again = kc.execute_interactive('print(repr(tuner.load("s1", "sqlite:///t.db", "sqlite:///m.db")))', timeout=120,
                                   output_hook=lambda msg: out.append(msg["content"].get("text", "")))
    assert again["content"]["status"] == "ok", again["content"]
    kept = sum(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in trials)
    assert f"<tuner.Result study='s1' trials={kept}: " in "".join(out), out


def _iopub(kc: BlockingKernelClient, msg_id: str) -> list[dict[str, Any]]:
    """The iopub messages of request ``msg_id``, up to its end (status idle)."""
    messages = []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages
        messages.append(msg)


def _left_beside(kernel_pid: int, timeout: float = 30) -> list[str]:
    """The processes other than the kernel still in its session (its own: jupyter_client starts it in
    a new one) after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        ps = subprocess.run(["ps", "-s", str(kernel_pid), "-o", "pid=,args="], capture_output=True, text=True).stdout
        left = [line for line in ps.splitlines() if int(line.split()[0]) != kernel_pid]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
