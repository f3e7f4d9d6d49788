"""The terminal view and its estimate of what is left (tuner.driver.progress, tuner.driver.eta), on a
fake clock: a simulated launch whose true end is known, so every estimate it printed can be checked."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from tuner.driver.eta import Eta, Work, harmonic
from tuner.driver.progress import PIPED_WIDTH, ProgressView, output_console
from tuner.driver.trialrecord import TrialRecord
from tuner.records import Phase, RunRecord, RunStatus, TrainConfig, TrialOutcome, TrialState

STEP = 0.01  # seconds a run takes per step
FIXED = 0.5  # seconds of a run that are not training steps (graph build, validation passes)
START_UP = 30.0  # seconds before the first record: Ray, TensorFlow's import in the workers
LEFT = re.compile(r"~(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)? left")


@dataclass
class FakeLaunch:
    """Drives a ProgressView as a one-slot launch would: run after run on a fake clock."""

    work: Work
    now: float = 0.0
    buffer: io.StringIO = field(default_factory=io.StringIO)
    view: ProgressView = field(init=False)
    seen: list[tuple[float, float | None]] = field(default_factory=list)  # (when, estimate) at each line

    def __post_init__(self) -> None:
        console = Console(file=self.buffer, width=80, soft_wrap=True)
        self.view = ProgressView(self.work.trials, live=False, console=console, steps=self.work.steps,
                                 work=self.work, clock=lambda: self.now)
        self.view.__enter__()
        self.now += START_UP

    def run(self, trial: int, seed: int, phase: Phase, steps: int, stop_at: int | None = None) -> RunRecord:
        """One run to its end (or stopped at ``stop_at``), a progress record every 25 steps."""
        self.now += FIXED / 2
        last = stop_at or steps
        for step in range(25, last + 1, 25):
            self.now += 25 * STEP
            self.view.on_trial_result(RunRecord(trial, seed, step, RunStatus.RUNNING, phase=phase))
        self.now += FIXED / 2
        status = RunStatus.SURVIVED if stop_at is None else RunStatus.CANCELLED
        info = {"train_seconds": last * STEP, "run_seconds": last * STEP + FIXED} if stop_at is None else {}
        final = RunRecord(trial, seed, last, status, final=True, steps_survived=last, val_loss=0.1,
                          init_val_loss=1.0, phase=phase, info=info)
        self.view.on_trial_result(final)
        self.note()
        return final

    def note(self) -> None:
        self.seen.append((self.now, self.view.eta.left()))

    def trial(self, number: int, seeds: int, stop_at: int | None = None, race: int = 0) -> None:
        config = TrainConfig(1e-2)
        self.view.on_trial_start(number, config, tuple(range(seeds)))
        finals = [self.run(number, s, Phase.SEARCH, self.work.steps, stop_at) for s in range(seeds)]
        if race:
            self.view.on_phase_start(number, Phase.RACE, config, tuple(range(10, 10 + race)))
            raced = [self.run(number, 10 + s, Phase.RACE, self.work.steps) for s in range(race)]
            self.view.on_phase_end(TrialOutcome(number, config, TrialState.SURVIVED, tuple(raced), 0.1,
                                                phase=Phase.RACE))
            finals += raced
        state = TrialState.SURVIVED if stop_at is None else TrialState.STOPPED
        told = TrialOutcome(number, config, state, tuple(finals), 0.1 if stop_at is None else None, reason="behind")
        self.view.on_trial_complete(told, TrialRecord.from_outcome(told, self.work.steps))
        self.note()

    def check(self, phase: Phase, passes: int = 1) -> None:
        """A verification (or ``passes`` margin passes) on the verification seeds."""
        config = TrainConfig(1e-2)
        steps = self.work.verify_steps if phase is Phase.VERIFY else self.work.steps
        for i in range(passes):
            seeds = tuple(range(100, 100 + self.work.verify_seeds))
            self.view.on_phase_start(0, phase, config, seeds)
            finals = tuple(self.run(0, s, phase, steps) for s in seeds)
            value = 10.0 if i < passes - 1 else 0.1  # the passes before the last did not learn (init: 1.0)
            self.view.on_phase_end(TrialOutcome(0, config, TrialState.SURVIVED, finals, value, phase=phase))

    def lines(self) -> list[str]:
        return self.buffer.getvalue().splitlines()


WORK = Work(trials=10, steps=100, seeds=2, race_seeds=4, verify_seeds=4, verify_steps=200, margin=True, slots=1)


def default_launch(work: Work = WORK, margin_passes: int = 1) -> FakeLaunch:
    """Trial 0 runs both seeds and races; the others run one seed, every other one stopped early."""
    launch = FakeLaunch(work)
    launch.trial(0, seeds=2, race=2)
    for number in range(1, work.trials):
        launch.trial(number, seeds=1, stop_at=50 if number % 2 else None)
    launch.check(Phase.VERIFY)
    launch.check(Phase.MARGIN, passes=margin_passes)
    return launch


def test_eta_is_within_2x_of_the_truth_from_the_first_trial_to_the_end() -> None:
    launch = default_launch()
    end = launch.now
    ratios = [left / (end - when) for when, left in launch.seen if end - when > 1.0 and left is not None]
    assert len(ratios) > 25 and all(left is not None for _, left in launch.seen)  # known from the first run on
    assert min(ratios) >= 0.5 and max(ratios) <= 2.0, (min(ratios), max(ratios))


def test_eta_counts_verification_and_margin_at_the_last_trial_and_while_verifying() -> None:
    launch = default_launch()
    lines = launch.lines()
    last_trial = next(line for line in lines if line.startswith(f"[{WORK.trials}/{WORK.trials} "))
    checks = WORK.verify_seeds * (WORK.verify_steps + WORK.steps) * STEP  # what the checks train, at least
    assert seconds_left(last_trial) >= checks  # 0 when only trials counted: "~0s left" with a minute to go
    verifying = [line for line in lines if line.startswith("[verify ")]
    assert [line.split()[1] for line in verifying] == ["1/4", "2/4", "3/4", "4/4"]
    assert all("left" in line for line in verifying)
    assert "seed 100: survived, val_loss 0.1" in verifying[0]
    margins = [line for line in lines if line.startswith("[margin ")]
    assert len(margins) == WORK.verify_seeds and "left" not in margins[-1]  # nothing left at the very end


def test_eta_adds_a_margin_pass_after_one_that_did_not_learn() -> None:
    eta = Eta(WORK, clock=lambda: 0.0)
    config = TrainConfig(1e-2)
    for phase in (Phase.VERIFY, Phase.MARGIN):
        eta.phase_started(0, phase, 4)
        eta.phase_ended(TrialOutcome(0, config, TrialState.SURVIVED, (), 10.0, phase=phase))
    assert eta.remaining()[Phase.MARGIN] == (0.0, 0.0)  # learned is unknown (no runs): counted as a pass
    eta.phase_started(0, Phase.MARGIN, 4)
    no_gain = RunRecord(0, 1, 100, RunStatus.SURVIVED, final=True, steps_survived=100, val_loss=2.0,
                        init_val_loss=1.0, phase=Phase.MARGIN)
    eta.phase_ended(TrialOutcome(0, config, TrialState.SURVIVED, (no_gain,), 2.0, phase=Phase.MARGIN))
    assert eta.remaining()[Phase.MARGIN] == (4 * 100, 4)  # did not learn: the next factor's pass is to come


def test_eta_before_any_run_is_unknown_then_from_the_flags() -> None:
    now = [0.0]
    eta = Eta(WORK, clock=lambda: now[0])
    assert eta.left() is None  # nothing measured: no number is better than a wild one
    eta.trial_started(0)
    for step in (25, 50):
        now[0] += 25 * STEP
        eta.record(RunRecord(0, 7, step, RunStatus.RUNNING))
    assert eta.seconds_per_step() == pytest.approx(STEP)
    left = eta.remaining()
    assert left[Phase.VERIFY] == (4 * 200, 4) and left[Phase.MARGIN] == (4 * 100, 4)
    # the first trial's seed is half way; the other 9 trials at every seed to the end until measured
    assert left[Phase.SEARCH][0] == pytest.approx(200 - 50 + 9 * 200)
    assert left[Phase.RACE][0] == pytest.approx(harmonic(1, 10) * 2 * 100)


def test_harmonic_sums_and_its_integral_agree() -> None:
    assert harmonic(1, 1) == 1.0 and harmonic(5, 4) == 0.0
    assert harmonic(2, 5000) == pytest.approx(sum(1 / k for k in range(2, 5001)), rel=1e-4)


def test_piped_console_never_wraps_a_line_and_a_terminal_one_is_rich_s() -> None:
    piped = output_console(file=io.StringIO())
    assert not piped.is_terminal and piped.width == PIPED_WIDTH
    line = "[3/30 1m05s elapsed, ~2m10s left] trial 7: stopped: " + "its first seed's loss was behind " * 10
    piped.print(line, highlight=False, markup=False)
    assert piped.file.getvalue() == line + "\n"  # type: ignore[attr-defined]
    terminal = output_console(file=io.StringIO(), force_terminal=True, width=90)
    assert terminal.is_terminal and terminal.width == 90 and not terminal.soft_wrap


def test_no_live_view_when_the_console_is_not_a_terminal_even_if_asked() -> None:
    buffer = io.StringIO()
    with ProgressView(3, live=True, console=Console(file=buffer)) as view:
        view.on_trial_start(0, TrainConfig(1e-2), (1,))
        view.on_trial_result(RunRecord(0, 1, 25, RunStatus.RUNNING))
    assert not view.live_mode and buffer.getvalue() == ""  # no redraws in a log file
    on_terminal = ProgressView(3, console=Console(file=io.StringIO(), force_terminal=True))
    assert on_terminal.live_mode


def test_a_verification_alone_shows_its_runs_and_no_trial_number() -> None:
    buffer = io.StringIO()
    work = Work(0, 100, verify_seeds=2, verify_steps=100)
    with ProgressView(0, console=Console(file=buffer, soft_wrap=True), work=work, label=lambda _: "best.yaml") as view:
        view.on_phase_start(0, Phase.VERIFY, TrainConfig(1e-2), (11, 12))
        diverged = RunRecord(0, 11, 37, RunStatus.DIVERGED, final=True, steps_survived=36, phase=Phase.VERIFY)
        view.on_trial_result(diverged)
        view.on_trial_result(RunRecord(0, 12, 40, RunStatus.CANCELLED, final=True, steps_survived=40,
                                       phase=Phase.VERIFY))
        view.on_phase_end(TrialOutcome(0, TrainConfig(1e-2), TrialState.DIVERGED, (diverged,), phase=Phase.VERIFY))
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("[verify 1/2 ") and lines[0].endswith("] best.yaml seed 11: diverged at step 37")
    assert lines[1].startswith("  best.yaml verify: survived 0/1") and len(lines) == 2  # no line for a cancelled run


def seconds_left(line: str) -> float:
    match = LEFT.search(line)
    assert match, line
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return 3600 * hours + 60 * minutes + seconds


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_piped_launch_and_verify_print_each_event_on_one_line(tmp_path: Path) -> None:
    """Piped (not a terminal: 80 columns for rich), each event is one whole line that starts with its
    marker; ``tuner verify`` prints a line per run that ended, naming the file, not a trial 0."""
    import optuna

    from tests.conftest import FINISHED, NO_VERIFY, run_tuner
    from tuner.driver.trialrecord import read

    storage = f"sqlite:///{tmp_path / 't.db'}"
    args = ["launch", "--trials", "3", "--steps", "60", "--seeds", "2", "--study", "s", "--storage", storage,
            "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "best.yaml"),
            "--num-cpus", "2", "--report-every", "20", *NO_VERIFY, "--live"]  # --live: ignored, not a terminal
    result = run_tuner(args, cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    events = lines[: next(i for i, line in enumerate(lines) if line.strip() == "trials")]  # up to the table
    assert events[0].startswith("study 's' on ")
    assert all(line.startswith("[") for line in events[1:]), events  # no line is the rest of another
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert len(events) == 1 + len(trials) == 4
    for trial in trials:
        record = read(trial)
        assert record is not None
        line = next(line for line in events if f"] trial {trial.number}: {record.state.value}" in line)
        assert line.startswith(f"[{events.index(line)}/3 ") and "elapsed" in line  # [k/3 for the k-th trial to end
        assert " | learning_rate=" in line  # the whole event: its state, then its knobs

    result = run_tuner(["verify", "best.yaml", "--seeds", "2", "--steps", "60", "--min-survival", "0.3",
                        "--num-cpus", "2"], cwd=tmp_path)
    assert result.returncode in FINISHED, result.stdout[-3000:] + result.stderr[-3000:]
    runs = [line for line in result.stdout.splitlines() if line.startswith("[verify ")]
    assert runs and runs[-1].startswith("[verify 2/2 ") and all("] best.yaml seed " in line for line in runs)
    assert "trial 0" not in result.stdout


def test_the_estimate_is_made_at_most_once_a_second_and_counts_down_between() -> None:
    """A cluster ends trials ten a second; each line's estimate reads every trial in flight
    (``Eta.left``): it is made again once a second, and counted down by the clock between."""
    launch = FakeLaunch(WORK)
    launch.trial(0, WORK.seeds)  # measured: an estimate is known
    made = []
    real = launch.view.eta.left
    launch.view.eta.left = lambda: made.append(launch.now) or real()  # type: ignore[method-assign]
    shown = []
    launch.now += 5.0  # the last estimate (the trial's lines) is 5 s old
    for _ in range(20):  # 20 lines in 2 s
        launch.now += 0.1
        shown.append(seconds_left(launch.view.clock()))
    assert len(made) == 2 and made[1] - made[0] == pytest.approx(1.0)
    assert shown[:10] == sorted(shown[:10], reverse=True) and shown[0] > shown[9]  # counted down within the second
