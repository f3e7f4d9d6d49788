"""Ends an embedded Ray cluster's every process once its driver is gone, ``kill -9`` included.

Run as a script, standard library only (``python -I -S reaper.py DRIVER_PID FOLDER``), in its own
session, with its stdin a pipe whose only write end the driver holds. When the driver exits, or
closes its cluster, the pipe reads end-of-file; the reaper then SIGKILLs every process (but the
driver) that holds a file under ``FOLDER``, the cluster's private temporary folder, and removes
the folder.

Why Ray's own fate-sharing is not enough (Ray 2.60, Linux): the processes the driver starts (GCS,
raylet, monitor, log monitor, dashboard) die with it (``PR_SET_PDEATHSIG``), and the workers end
once their raylet is gone, but the raylet's two agents (``DashboardAgent``, ``RuntimeEnvAgent``)
notice their raylet's death within 2 s and then spend 60 s trying to report it to the dead GCS
(``publish_error_to_driver``) before they exit: a ``kill -9`` of the driver left them alive for
about a minute. Every process of the cluster holds a file under its temporary folder (logs,
sockets), and that folder is private to the one cluster (``tuner.driver.embedded``), so the
holders of its files are exactly the cluster's processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

ROUNDS = 5  # scans for holders: a process that was being started during a scan is found by the next


def holders(folder: Path, skip: set[int]) -> list[int]:
    """Processes (but those in ``skip``) with an open file, or their working folder, under ``folder``."""
    inside = str(folder) + os.sep
    found: list[int] = []
    if not os.path.isdir("/proc"):  # not Linux: Ray's own fate-sharing only
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            links = [os.readlink(f"/proc/{entry.name}/cwd")]
            links += [os.readlink(f"/proc/{entry.name}/fd/{fd}") for fd in os.listdir(f"/proc/{entry.name}/fd")]
        except OSError:  # gone, or not ours
            continue
        if any(link.startswith(inside) for link in links):
            found.append(int(entry.name))
    return found


def reap(folder: Path, driver: int) -> int:
    """SIGKILL the holders of files under ``folder`` (never ``driver`` or this process), remove it;
    return how many processes were killed."""
    skip, killed = {driver, os.getpid()}, 0
    for _ in range(ROUNDS):
        pids = holders(folder, skip)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        skip.update(pids)
        time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)
    return killed


def main(argv: list[str]) -> int:
    """``reaper.py DRIVER_PID FOLDER``: wait for end-of-file on stdin, then :func:`reap`."""
    driver, folder = int(argv[1]), Path(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the driver's to handle
    while sys.stdin.buffer.read(4096):
        pass
    reap(folder, driver)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
