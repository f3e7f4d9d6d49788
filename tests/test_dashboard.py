"""The notes optuna-dashboard shows per trial: written by a listener as the search tells each
trial, again once a config is verified, read back with optuna-dashboard's own ``get_note``.
(The dashboard itself, in a browser: tests/test_ui.py.)"""

from __future__ import annotations

import optuna
from optuna_dashboard import get_note

from tests.test_search import FakeExecutor, make_search
from tests.test_trialrecord import outcome
from tuner.driver import dashboard, studyrecord
from tuner.driver.evidence import Verification
from tuner.driver.trialrecord import ATTR, SeedResult, SeedStatus, TrialRecord


def note_of(study: optuna.Study, number: int) -> str:
    return get_note(optuna.Trial(study, study.trials[number]._trial_id))


def test_each_told_trial_gets_a_note_a_person_reads_and_a_verified_one_is_noted_again() -> None:
    notes = dashboard.Notes(None)
    search = make_search(2, FakeExecutor(), optuna.samplers.RandomSampler(seed=0), callbacks=[notes])
    notes.study = search.study
    search.study.enqueue_trial({"learning_rate": 10**-2.5})  # survives
    search.study.enqueue_trial({"learning_rate": 0.005 / 0.8 * 10})  # diverges at step 80 or 81
    search.run()
    survived, diverged = note_of(search.study, 0), note_of(search.study, 1)
    assert survived.startswith("### Trial 0: survived, val loss ") and "| seed | phase | how it ended |" in survived
    assert "survived 200 steps" in survived and "learning_rate: 0.00316" in survived  # the config as YAML
    seeds = search.study.trials[1].user_attrs[ATTR]["seeds"]
    first = min(s["step"] for s in seeds if s["status"] == "diverged")
    assert diverged.startswith(f"### Trial 1: diverged at step {first} (loss, seed ")
    assert "{" not in diverged  # no JSON

    studyrecord.save_verification(search.study, 0, Verification((11, 12), 200, 2, 2, 0.5))
    dashboard.refresh(search.study)
    assert "- verified on fresh seeds: survived 2/2" in note_of(search.study, 0)
    assert note_of(search.study, 1) == diverged  # not verified: not written again


def test_a_note_names_the_op_and_stays_within_one_chunk_however_many_seeds() -> None:
    record = TrialRecord.from_outcome(outcome(), steps=100)
    text = dashboard.note(record)
    assert text.splitlines()[0] == "### Trial 3: diverged at step 34 (loss, `iter_2/recompute_input/Log`, seed 5)"
    assert "| 6 | search | cancelled at step 40 |" in text
    many = TrialRecord(3, record.state, record.config, 100,
                       tuple(SeedResult(2**30 + i, SeedStatus.SURVIVED, 100, 100) for i in range(300)))
    text = dashboard.note(many)
    assert len(text) <= dashboard.MAX_CHARS and text.rstrip().endswith("```")  # the config is kept whole
    assert f"more (the trial's `{ATTR}` attribute has them all)" in text
