"""tuner.atomic: a file is written whole or not at all; a full disk leaves the earlier file as it was."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.fulldisk import full_disk
from tests.test_report import PNG, row
from tuner import atomic
from tuner.driver.export import write_best
from tuner.driver.plots import write_plots
from tuner.errors import OutputError

EARLIER = b"config:\n  learning_rate: 0.01\n"


def leftovers(folder: Path) -> list[str]:
    """Temporary files the writer left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_text_replaces_the_file_keeps_its_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "best.yaml"
    target.write_bytes(EARLIER)
    target.chmod(0o640)
    atomic.write_text(target, "config: {}\n")
    assert target.read_text() == "config: {}\n"
    assert target.stat().st_mode & 0o777 == 0o640
    new = atomic.write_text(tmp_path / "new.yaml", "x\n", mode=0o600)
    assert new.stat().st_mode & 0o777 == 0o600
    assert leftovers(tmp_path) == []


def test_write_text_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_bytes(EARLIER)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    atomic.write_text(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_write_into_a_missing_folder_is_one_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"cannot write .*gone/best.yaml: No such file"):
        atomic.write_text(tmp_path / "gone" / "best.yaml", "x")


def test_full_disk_leaves_the_earlier_file_intact_and_no_temp(tmp_path: Path) -> None:
    with full_disk(tmp_path / "disk", {"best.yaml": EARLIER}) as disk:
        with pytest.raises(OutputError, match=r"the disk holding .* is full \(No space left on device\)"):
            atomic.write_text(disk / "best.yaml", "config:\n" + "  k: 1\n" * 1000)
        assert (disk / "best.yaml").read_bytes() == EARLIER
        assert leftovers(disk) == []


def test_write_best_and_plots_on_a_full_disk_keep_the_earlier_files(tmp_path: Path) -> None:
    plots = {"s_stability_map.png": PNG + b"earlier map", "s_survival.png": PNG + b"earlier curves"}
    with full_disk(tmp_path / "disk", {"best.yaml": EARLIER, **plots}) as disk:
        with pytest.raises(OutputError, match="is full"):
            write_best(disk / "best.yaml", {"config": {"learning_rate": 0.5}, "stability": {"steps": 100}})
        with pytest.raises(OutputError, match="is full"):
            write_plots([row(0, 0.01, (100, 100))], disk, study="s")
        assert yaml.safe_load((disk / "best.yaml").read_bytes()) == {"config": {"learning_rate": 0.01}}
        assert {name: (disk / name).read_bytes() for name in plots} == plots
        assert leftovers(disk) == []


def test_a_file_size_limit_leaves_the_earlier_file_intact(tmp_path: Path) -> None:
    """No privilege needed: RLIMIT_FSIZE makes the write fail (EFBIG) part way, as a full disk does."""
    target = tmp_path / "best.yaml"
    target.write_bytes(EARLIER)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal that kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    code = ("import sys; from tuner import atomic; from tuner.errors import OutputError\n"
            "try: atomic.write_bytes(sys.argv[1], b'x' * (1 << 20))\n"
            "except OutputError as e: print(e); sys.exit(e.exit_code)")
    done = subprocess.run([sys.executable, "-c", code, str(target)], preexec_fn=limit, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == OutputError.exit_code == 6, done.stderr
    assert "File too large; the earlier file is unchanged" in done.stdout
    assert target.read_bytes() == EARLIER
    assert leftovers(tmp_path) == []
