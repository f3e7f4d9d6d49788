"""Real multi-node Ray clusters and a real MLflow server on this machine, for tests.

Each node is a ``ray start --block`` process in its own process group: killing the group kills
that node (its raylet, and the GCS for the head) and nothing else, so tests never need
``ray stop``, which would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def _env() -> dict[str, str]:
    from tuner.driver.executor import _ensure_token

    _ensure_token()
    return {**os.environ, "RAY_AUTH_MODE": "token"}


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args], env=_env(),
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


RAY_ADDRESS_FILE = Path("/tmp/ray/ray_current_cluster")  # `ray start --head` leaves its address here


def names_port(port: int) -> bool:
    """Whether Ray's address file (where a plain ``ray.init()`` looks for a cluster) names ``port``."""
    try:
        return RAY_ADDRESS_FILE.read_text().strip().rpartition(":")[2] == str(port)
    except OSError:
        return False


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started in its own session, with everything in its group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


@dataclass
class RayNodes:
    """A head node and worker nodes of one Ray cluster, each a ``ray start --block`` group."""

    port: int
    head: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> int:
        out = subprocess.run([str(BIN / "ray"), "status", f"--address={self.address}"], env=_env(),
                             capture_output=True, text=True, timeout=60).stdout
        active = out.split("Active:")[1].split("Pending:")[0] if "Active:" in out else ""
        return active.count("node_")

    def wait_alive(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while self.alive() != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not reach {count} alive node(s)")
            time.sleep(1)

    def stop(self) -> None:
        for process in [*self.workers, self.head]:
            kill_group(process)
        if names_port(self.port):  # a plain ray.init() on this machine would try to join the dead cluster
            RAY_ADDRESS_FILE.unlink(missing_ok=True)


def start_cluster(head_cpus: int = 1, workers: int = 1, worker_cpus: int = 1) -> RayNodes:
    """A real cluster: a head and ``workers`` worker nodes, all on this machine."""
    port = free_port()
    head = _start(["--head", f"--port={port}", f"--num-cpus={head_cpus}", "--include-dashboard=false"])
    nodes = RayNodes(port, head)
    try:
        wait_port(port)  # the head's GCS answers: the workers can join while its own raylet starts
        nodes.workers = [_start([f"--address={nodes.address}", f"--num-cpus={worker_cpus}", "--num-gpus=0"])
                         for _ in range(workers)]
        nodes.wait_alive(1 + workers)
    except BaseException:
        nodes.stop()
        raise
    return nodes


def start_mlflow_server(backend: str, port: int) -> subprocess.Popen[bytes]:
    """A real ``mlflow server`` on 127.0.0.1:port, in its own process group."""
    process = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--backend-store-uri", backend, "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_port(port, timeout=90)
    return process
