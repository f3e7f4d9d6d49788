"""An MLflow client in a process of its own, for a large cluster: the tracker's writes off the driver's GIL.

On a large cluster the MLflow sender's writes were the largest share of the driver process (39 % of
its CPU at 500 slots on SQLite, where the store's SQL runs in the client: BENCHMARKS.md), and they
held the GIL that the search loop needs to keep up with the cluster's records. A
:class:`ClientProcess` is a stand-in for ``MlflowClient``: each method call is pickled over a
socket to a child process that holds the real client and answers with its result or its error,
so the tracker's code is the same either way and its queue keeps its order (the sender waits for
each answer, with the GIL released). Metric points travel as tuples and become MLflow's ``Metric``
in the child (:meth:`ClientProcess.log_points`).

The launch uses it on a cluster of ``tuner.driver.launch.PROCESS_SLOTS`` slots or more; below that
the thread is cheaper than a second interpreter that imports MLflow. The child ignores the stop
signals (a Ctrl-C or a closed terminal reaches the whole process group: the driver decides when to
flush and stop), and ends when the driver closes the socket or dies.

An error in the child is raised in the driver as :class:`RemoteError` with the same text (an
``OSError`` with its errno), so that the sender tells a server that is away from a full disk as it
does in-process (``tuner.driver.mlflow_sender.for_good``). A child that died is started again at
the next call; a call it cut short fails, and the sender sends it again. The child is as quiet as
the launch (``tuner.driver.launch.quiet_third_party``): what failed reaches the driver, which says it.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

Point = tuple[str, float, int, int]  # (key, value, ms, step), as tuner.driver.mlflow_sender's


class RemoteError(Exception):
    """An error the MLflow client raised in the child process (its type's name and text)."""


class ClientProcess:
    """An ``MlflowClient`` of ``uri`` in a child process (see the module docs); one call at a time."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        code = f"from {__name__} import serve; serve({theirs.fileno()})"
        self._child = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                       stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send_bytes(self.uri.encode())  # not in the command line, which `ps` shows: it may hold a password

    @property
    def pid(self) -> int | None:
        """The child's process id (None once closed)."""
        return self._child.pid if self._child is not None else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return functools.partial(self.call, name)

    def log_points(self, run_id: str, points: list[Point]) -> None:
        """``log_batch`` of metric points given as (key, value, ms, step) tuples."""
        self.call("log_points", run_id, points)

    def call(self, name: str, *args: object, **kwargs: object) -> Any:
        """Call the client's method ``name`` in the child and return its result, or raise its error."""
        with self._lock:
            if self._child is None or self._child.poll() is not None:
                self._restart()
            assert self._conn is not None
            try:
                self._conn.send_bytes(pickle.dumps((name, args, kwargs)))
                ok, value = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError) as exc:  # the child died, or its socket broke: the next call starts another
                self._discard()
                raise RemoteError(f"the MLflow client process ended ({type(exc).__name__}: {exc})") from None
        if not ok:
            raise value
        return value

    def _restart(self) -> None:
        if self._child is not None:
            log.warning("the MLflow client process ended (exit %s); starting another", self._child.returncode)
        self._close_conn()
        self._start()

    def _discard(self) -> None:
        """End the child at once (dead, or alive on a broken socket), so that the next call starts another."""
        self._end(grace=0.0)

    def _end(self, grace: float) -> None:
        """Close the socket; the child gets ``grace`` seconds to exit, then is killed."""
        self._close_conn()
        if self._child is not None:
            try:
                self._child.wait(grace)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
            self._child = None

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def cpu_seconds(self) -> float:
        """The child's CPU time so far, user and system (Linux's /proc; 0.0 where it cannot be read)."""
        if self._child is None:
            return 0.0
        try:
            with open(f"/proc/{self._child.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self, timeout: float = 10.0) -> None:
        """End the child: it finishes the call in hand and exits when the socket closes."""
        with self._lock:
            self._end(grace=timeout)


def _error(exc: BaseException) -> Exception:
    """What the driver raises for the child's ``exc``: an OSError keeps its errno, the rest their text."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return OSError(exc.errno, exc.strerror or str(exc))
    return RemoteError(str(exc) or type(exc).__name__)


def serve(fd: int) -> None:
    """The child's loop: answer calls on the socket ``fd`` until it closes (its first message is the uri)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the driver stops it (see the module docs)
    from tuner import environ

    environ.quiet_mlflow()
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    from mlflow.entities import Metric

    from tuner.driver.mlflow_runs import client

    conn = Connection(fd)
    try:
        mlflow = client(conn.recv_bytes().decode())
    except (EOFError, OSError):
        os._exit(0)
    while True:
        try:
            name, args, kwargs = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the driver closed the socket or died
            os._exit(0)
        try:
            if name == "log_points":
                run_id, points = args
                value = mlflow.log_batch(run_id, metrics=[Metric(*p) for p in points])
            else:
                value = getattr(mlflow, name)(*args, **kwargs)
            answer = pickle.dumps((True, value))
        except Exception as exc:  # any error of the client goes back to the driver, which decides
            answer = pickle.dumps((False, _error(exc)))
        try:
            conn.send_bytes(answer)
        except OSError:
            os._exit(0)
