"""A launch's embedded Ray cluster, read from the OS while it runs: it listens on the loopback only,
keeps its files in a private folder, and none of its processes outlives the driver, ``kill -9``
included (``tuner.driver.embedded``, ``tuner.driver.reaper``).

Each test runs a real ``python -m tuner launch`` in a subprocess (its own embedded cluster, not the
session's) and reads its processes, sockets and files from ``/proc``; Linux only, as Ray's own
fate-sharing is.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import FINISHED, NO_VERIFY, ROOT, made_study
from tuner.driver import reaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
PREFIX = "tuner-ray-"  # the private folder's name (tuner.driver.embedded.private_folder)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ... (None: gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, by parent pid."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat:
            children.setdefault(int(stat[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie has ended)."""
    return [pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] != "Z"]


def in_session(sid: int) -> list[int]:
    return [pid for pid in _pids() if (stat := _stat(pid)) is not None and int(stat[3]) == sid and stat[0] != "Z"]


def _address(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket, IPv4 and IPv6."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                host, port = fields[1].split(":")
                found[int(fields[9])] = (_address(host), int(port, 16))
    return found


def _links(pid: int) -> list[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    links = []
    for fd in fds:
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "?"


def listening_of(pids: list[int]) -> set[tuple[str, int, str]]:
    """(address, port, process) of the listening TCP sockets that ``pids`` hold."""
    table = listening_sockets()
    found = set()
    for pid in pids:
        for link in _links(pid):
            if link.startswith("socket:[") and int(link[8:-1]) in table:
                found.add((*table[int(link[8:-1])], _name(pid)))
    return found


def private_folders(pids: list[int]) -> set[Path]:
    """The ``tuner-ray-*`` folders that ``pids`` hold files in."""
    found = set()
    for pid in pids:
        for link in _links(pid):
            parts = Path(link).parts
            for i, part in enumerate(parts):
                if part.startswith(PREFIX):
                    found.add(Path(*parts[: i + 1]))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, an IPv6 socket bound to the IPv4 loopback
    return (mapped or ip).is_loopback


def start_launch(tmp_path: Path, args: list[str]) -> subprocess.Popen[bytes]:
    """``python -m tuner launch ARGS`` with tmp stores, in a session of its own, its output in launch.log."""
    stores = ["--storage", f"sqlite:///{tmp_path / 't.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
              "--out", str(tmp_path / "best.yaml"), "--study", "s1", "--num-cpus", "1", "--no-live"]
    with (tmp_path / "launch.log").open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "tuner", "launch", *args, *stores], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                start_new_session=True)


def log_of(tmp_path: Path) -> str:
    return (tmp_path / "launch.log").read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_ports_a_launch_listens_on_the_loopback_only_and_keeps_its_files_private(tmp_path: Path) -> None:
    """Every listening socket of the launch's process tree, read every 0.3 s from start to end, is on
    127.0.0.1 (or ::1); Ray's files are in a 0700 folder, removed when the launch ends."""
    driver = start_launch(tmp_path, ["--trials", "2", "--steps", "400", "--seeds", "1", "--report-every", "50",
                                     *NO_VERIFY])
    sockets: set[tuple[str, int, str]] = set()
    folders: dict[Path, int] = {}  # private folder -> its mode, read while the launch ran
    deadline = time.monotonic() + 400
    while driver.poll() is None:
        assert time.monotonic() < deadline, log_of(tmp_path)
        tree = descendants(driver.pid)
        sockets |= listening_of(tree)
        for folder in private_folders(tree):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: the launch is closing
                folders.setdefault(folder, folder.stat().st_mode & 0o777)
        time.sleep(0.3)
    assert driver.returncode in FINISHED, log_of(tmp_path)
    assert any(name.startswith("ray::TrialWorker") for _, _, name in sockets), sockets  # the workers were seen
    assert len({name for _, _, name in sockets}) >= 5, sockets  # GCS, raylet, agents, driver, workers
    outside = sorted(s for s in sockets if not is_loopback(s[0]))
    assert not outside, f"listening beyond the loopback: {outside}"
    assert len(folders) == 1, folders  # one cluster, one folder
    folder, mode = folders.popitem()
    assert mode == 0o700, oct(mode)
    assert not folder.exists()  # removed at the end


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.tf
def test_ports_kill_9_of_the_driver_leaves_no_process_of_its_cluster(tmp_path: Path) -> None:
    """``kill -9`` of the driver alone, while a trial runs: within 30 s no process of its session or
    of its process tree (captured before the kill) is left, and its private folder is gone."""
    driver = start_launch(tmp_path, ["--trials", "20", "--steps", "2000", "--seeds", "1", "--race-seeds", "0",
                                     "--verify-seeds", "0", "--no-margin", "--report-every", "100"])
    storage, deadline = f"sqlite:///{tmp_path / 't.db'}", time.monotonic() + 300
    while not (_worker_runs(driver.pid) and _trial_running(storage)):
        assert driver.poll() is None and time.monotonic() < deadline, log_of(tmp_path)
        time.sleep(0.3)
    tree = descendants(driver.pid)
    folders = private_folders(tree)
    assert len(tree) >= 6 and len(folders) == 1, (tree, folders)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(30)
    deadline = time.monotonic() + 30
    while (alive(tree) or in_session(driver.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {pid: _name(pid) for pid in alive(tree) + in_session(driver.pid)}
    assert not left, f"outlived the driver by 30 s: {left}"
    assert not folders.pop().exists()


def _worker_runs(pid: int) -> bool:
    return any(_name(p).startswith("ray::TrialWorker") for p in descendants(pid))


def _trial_running(storage: str) -> bool:
    made = made_study(storage, "s1")
    if made is None:
        return False
    trials = made.trials
    return any(t.state == optuna.trial.TrialState.RUNNING for t in trials)


def test_reaper_kills_every_holder_of_the_folders_files_and_removes_it(tmp_path: Path) -> None:
    """The reaper, its pipe closed, ends a process holding a file of its folder (and not one holding
    none, nor the driver it was given) and removes the folder."""
    folder = tmp_path / f"{PREFIX}x"
    (folder / "r").mkdir(parents=True)
    with (folder / "r" / "held.log").open("w") as held:
        holder = subprocess.Popen(["sleep", "120"], stdout=held)
    bystander = subprocess.Popen(["sleep", "120"], stdout=subprocess.DEVNULL)
    spare = subprocess.Popen(["sleep", "120"], stdout=(folder / "spare.log").open("w"))  # stands for the driver
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", reaper.__file__, str(spare.pid), str(folder)],
                                   stdin=subprocess.PIPE, start_new_session=True)
        assert process.stdin is not None
        time.sleep(0.5)
        assert holder.poll() is None  # nothing happens while the pipe is open
        process.stdin.close()
        assert process.wait(10) == 0
        assert holder.wait(10) == -signal.SIGKILL
        assert bystander.poll() is None and spare.poll() is None
        assert not folder.exists()
    finally:
        for p in (holder, bystander, spare):
            p.kill()
            p.wait()
