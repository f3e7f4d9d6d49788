"""The tracker's sender: an ordered queue of MLflow operations, metric points in batches, a background thread.

Every write of ``tuner.driver.tracking`` goes through this queue, which a background thread sends
(about once a second, and at once when woken), so the search loop never waits for MLflow: a slow
or remote store does not idle a worker. When the tracking server does not answer, the operations
stay queued, a warning is printed once, and the next send retries: nothing is lost. Metrics go in
``log_batch`` calls of up to 1000, never one call per metric.

For a large cluster, where sending every value of every record as a metric point would outrun
MLflow's store (what each costs: BENCHMARKS.md, "A driver for a large cluster"): a run's points are
sent once it has 1000 of them or its oldest is older than an interval that grows with the runs
logging at once (about 10 calls a second in all, at least 1 s, at most 10 s); and when more than
10,000 points wait to be sent (:meth:`Sender.spilling`), the tracker puts a progress record's values
other than ``loss`` in rows of its run's ``telemetry.json`` (one table per seed, named as the seed's
metrics are: ``s0``, ``s1``, ...) instead of metric points, until the queue is short again.

On a cluster of 64 slots or more the client is a :class:`~tuner.driver.mlflow_process.ClientProcess`:
the same calls, answered by an MLflow client in a process of its own, so that the writes' CPU is not
the search loop's; the sender's thread waits for each answer with the GIL released.

A run is named by a *target*: a trial number (the trial's own run) or a phase run's name, which
the tracker resolves to a run id when the operation is sent (the run may be created late).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

_BATCH = 1000
_CALLS_PER_S = 10  # metric calls a second the sender aims at, however many runs log at once
_SPILL = 10_000  # metric points waiting to be sent above which telemetry goes to telemetry.json
TELEMETRY_FILE = "telemetry.json"

Target = int | str  # a trial number, or a phase run's name
Point = tuple[str, float, int, int]  # (key, value, ms, step)


class Sender:
    """Sends queued operations in order from a background thread (see the module docs).

    Args:
        client: the MLflow client.
        where: the store's URI as the warnings show it (password masked).
        run_of: a target's run id, when an operation on it is sent.
        before: called under the lock before each operation is sent (the tracker creates its
            trials' runs there, ahead of the queue).
    """

    def __init__(self, client: MlflowClient, where: str, run_of: Callable[[Target], str],
                 before: Callable[[], None]) -> None:
        from mlflow.entities import Metric

        self._Metric, self.client, self._where, self._run_of, self._before = Metric, client, where, run_of, before
        self._ops: deque[Callable[[], object]] = deque()
        self._metrics: dict[Target, list[Point]] = {}  # target -> points buffered
        self._since: dict[Target, float] = {}  # target -> when its oldest buffered point came
        self._tables: dict[Target, dict[str, list[dict[str, float]]]] = {}  # target -> table -> rows spilled
        self._rows_in = self._rows_queued = self._rows_out = 0  # metric points buffered, queued, sent
        self.down = False  # the last send failed (warned once)
        self.broken: str | None = None  # why the store fails for good (a full disk): nothing more is sent
        self._last_queued = time.monotonic()
        self.lock = threading.Lock()  # one sender at a time: the background thread, or flush()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._send_loop, name="tuner-mlflow", daemon=True)
        self._thread.start()

    def append(self, op: Callable[[], object]) -> None:
        """Queue an operation, sent after those queued before it (retried until it goes)."""
        if self.broken is None:
            self._ops.append(op)

    def backlog(self) -> int:
        """Metric points buffered or queued and not yet sent."""
        return self._rows_in - self._rows_out

    def behind(self) -> int:
        """Metric points queued and not yet sent (how far the store is behind)."""
        return self._rows_queued - self._rows_out

    def spilling(self) -> bool:
        """Whether so many points wait that telemetry should go to telemetry.json (see the module docs)."""
        return self.backlog() > _SPILL

    def add(self, target: Target, points: list[Point]) -> None:
        """Buffer metric points of a run; queue the runs that are due (at most every 0.25 s)."""
        if self.broken is not None:
            return
        batch = self._metrics.setdefault(target, [])
        if not batch:
            self._since[target] = time.monotonic()
        batch.extend(points)
        self._rows_in += len(points)
        if time.monotonic() - self._last_queued > 0.25:
            self.queue_due()

    def add_row(self, target: Target, table: str, row: dict[str, float]) -> None:
        """Add a row to a table of the run's telemetry.json, logged when the run ends."""
        if self.broken is not None:
            return
        self._tables.setdefault(target, {}).setdefault(table, []).append(row)

    def wake(self) -> None:
        """Send now rather than within a second."""
        self._wake.set()

    def queue_all(self) -> None:
        """Queue every run's buffered metrics and spilled telemetry (from the search loop's thread only)."""
        for target in [*self._metrics, *self._tables]:
            self.queue_target(target)

    def queue_due(self) -> None:
        """Queue the metrics of the runs with 1000 points or whose oldest point is older than the
        interval (about ``_CALLS_PER_S`` calls a second in all); wake the sender."""
        now = time.monotonic()
        self._last_queued = now
        interval = min(10.0, max(1.0, len(self._metrics) / _CALLS_PER_S))
        for target, batch in list(self._metrics.items()):
            if len(batch) >= _BATCH or now - self._since[target] >= interval:
                self.queue_target(target, tables=False)
        self._wake.set()

    def queue_target(self, target: Target, tables: bool = True) -> None:
        """Queue one run's buffered metrics (and, at its end, its spilled telemetry)."""
        metrics = self._metrics.pop(target, [])
        self._rows_queued += len(metrics)
        for start in range(0, len(metrics), _BATCH):
            self._ops.append(functools.partial(self._log_metrics, target, metrics[start : start + _BATCH]))
        doc = self._tables.pop(target, None) if tables else None
        if doc:
            self._ops.append(lambda: self.client.log_dict(self._run_of(target), doc, TELEMETRY_FILE))

    def _log_metrics(self, target: Target, metrics: list[Point]) -> None:
        log_points = getattr(self.client, "log_points", None)  # a ClientProcess makes the Metrics in its process
        if log_points is not None:
            log_points(self._run_of(target), metrics)
        else:
            self.client.log_batch(self._run_of(target), metrics=[self._Metric(*m) for m in metrics])
        self._rows_out += len(metrics)

    def flush(self) -> bool:
        """Send every queued operation now, in order (waiting for the background sender); True if all went."""
        self.queue_all()
        return self._send()

    def _send(self) -> bool:
        """Send queued operations in order (``before`` first, each time); on failure keep the rest
        and warn once. The lock is taken per operation, so that a caller waits for one at most."""
        while self.broken is None:
            with self.lock:
                try:
                    self._before()
                    if not self._ops:
                        break
                    self._ops[0]()
                except Exception as exc:  # the server went away: keep the op, retry on the next send
                    why = for_good(exc)
                    if why:
                        self._give_up(why)
                        return False
                    if not self.down:
                        log.warning("MLflow at %s is not answering (%s); buffering and retrying",
                                    self._where, first_line(exc))
                        self.down = True
                    return False
                self._ops.popleft()
        if self.broken is not None:
            return False
        if self.down:
            log.warning("MLflow at %s answers again; the buffered records are logged", self._where)
            self.down = False
        return True

    def _give_up(self, why: str) -> None:
        """The store fails for good (a full disk, a lost permission): say so once, drop the queue and
        send nothing more; the study keeps every trial, and the next launch or ``tuner report`` closes
        the runs and logs the trials MLflow lacks (tuner.driver.orphans)."""
        self.broken = why
        self._ops.clear()
        self._metrics.clear()
        self._tables.clear()
        log.warning("MLflow at %s cannot store anything (%s): nothing more of this launch is logged to it; the "
                    "Optuna study keeps every trial, and once the store is writable `python -m tuner report` "
                    "closes this launch's runs and logs the trials it lacks", self._where, self.broken)

    def _send_loop(self) -> None:
        """The background sender: the queue about once a second, or at once when woken."""
        while not self._stopping:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if not self._stopping:
                self._send()

    def close(self, last: Callable[[], object], wait: float) -> None:
        """Queue everything buffered and then ``last``, stop the thread, and flush (retrying for up
        to ``wait`` seconds); warn of what could not be sent."""
        self.queue_all()  # with the telemetry.json of runs still open (an interrupted launch)
        self.append(last)
        self._stopping = True
        self._wake.set()
        self._thread.join()
        deadline = time.monotonic() + wait
        while not self.flush() and self.broken is None and time.monotonic() < deadline:
            time.sleep(1.0)
        if self._ops and self.broken is None:
            log.warning("MLflow did not come back: %d queued operations were not logged", len(self._ops))


# what a store that fails for good says: SQLite's and PostgreSQL's full disk, a lost write permission
_FOR_GOOD = ("database or disk is full", "no space left on device", "disk full", "readonly database",
             "read-only file system", "permission denied", "disk i/o error", "could not extend file")


def for_good(exc: BaseException) -> str | None:
    """Why the store cannot take writes until someone acts (a full disk, a lost permission), in its
    own words; None for a server that is away for a while (refused, timed out, 5xx)."""
    import errno
    import os

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        return os.strerror(exc.errno)
    text = " ".join(str(exc).lower().split())
    return next((phrase for phrase in _FOR_GOOD if phrase in text), None)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text, passwords masked (MLflow's quote the URL)."""
    from tuner.masking import mask

    text = str(exc).strip().splitlines()
    return mask(text[0][:300] if text else type(exc).__name__)
