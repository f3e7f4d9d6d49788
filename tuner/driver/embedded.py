"""The embedded Ray cluster: on the loopback only, its files private, its processes ended with the driver.

``ray.init(address="local")`` as Ray 2.60 starts it listens on all interfaces (GCS, raylet, object
manager, every worker, the dashboard agent, and the Prometheus ``/metrics`` endpoints on 0.0.0.0)
and on the machine's external address; its temporary folder ``/tmp/ray`` and session folders are
mode 777 without the sticky bit; and after ``kill -9`` of the driver, its agents live on for a
while (what was measured: docs/operations.md, "Security"; tests/test_ports.py). Started here instead:

- **Loopback.** The node's address is 127.0.0.1 (``tuner.hooks.loopback_node``); on that address
  Ray binds every server to 127.0.0.1 itself, the metrics endpoints included. Ray's public API has
  no such switch: ``ray.init`` and ``ray start`` turn a loopback ``node_ip_address`` into the
  external one. Token authentication stays on (``RAY_AUTH_MODE=token``).
- **A private folder.** ``tempfile.mkdtemp`` (mode 0700) holds Ray's temp folder, whose own mode
  Ray sets to 777; nobody else can enter it. Its path is short (``/tmp/tuner-ray-XXXXXXXX/r``):
  Ray's unix sockets live under it, and a socket path holds at most 107 bytes.
- **Fate.** A reaper (``tuner.driver.reaper``), started first, in a session of its own, waits on a
  pipe that only the driver holds open; when the driver exits, however it exits, the reaper
  SIGKILLs every process holding a file under the private folder and removes the folder.

It costs one more Python start (the reaper, standard library only) beside ``ray.init``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import environ
from tuner.driver import reaper as _reaper_module
from tuner.hooks import loopback_node

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MAX_BASE = 40  # longest temp base folder: Ray's socket paths under it stay below 107 bytes


@dataclass
class Embedded:
    """A running embedded cluster: its private folder and its reaper."""

    folder: Path
    reaper: subprocess.Popen[bytes]

    def close(self) -> None:
        """Shut Ray down, then let the reaper end what is left and remove the folder."""
        import ray

        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            self.release()

    def release(self) -> None:
        """Close the reaper's pipe: it ends the cluster's remaining processes and removes the folder."""
        if self.reaper.stdin is not None and not self.reaper.stdin.closed:
            self.reaper.stdin.close()
        try:
            self.reaper.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("the reaper of %s did not end within 10 s", self.folder)


def start(num_cpus: int | None, num_gpus: int | None, **init: Any) -> Embedded:
    """Start an embedded cluster (``ray.init(address="local", ...)`` with ``init``) as the module says."""
    import ray  # after tuner.environ.prepare_process (the caller's): Ray reads RAY_AUTH_MODE at import

    folder = private_folder()
    cluster = Embedded(folder, start_reaper(folder))
    try:
        with loopback_node():
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, _node_ip_address=LOOPBACK,
                     _temp_dir=str(folder / "r"), **init)
    except BaseException:
        cluster.release()
        raise
    return cluster


def private_folder() -> Path:
    """A new folder of mode 0700 for Ray's files, with a short path (``/tmp/tuner-ray-XXXXXXXX``)."""
    base = environ.ray_tmpdir() or tempfile.gettempdir()
    if len(base) > MAX_BASE:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="tuner-ray-", dir=base))


def start_reaper(folder: Path) -> subprocess.Popen[bytes]:
    """The reaper of ``folder``'s cluster, waiting for this process to close its pipe or to exit."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", _reaper_module.__file__, str(os.getpid()), str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the launch's process group leaves it to do its work
    )
