"""No hang on lost capacity: a watch over the executor for runs that no node can host.

Measured: when the embedded cluster's node dies (its raylet killed, as an out-of-memory kill of
Ray's agent does), the workers die, their replacements stay pending forever and nothing in Ray
ends that wait. :class:`Watched` wraps the executor (same protocol) and, while runs are in flight,
asks the cluster every few seconds whether any alive node can host a seed run. Once none could for
``timeout`` seconds:

- on the embedded cluster tuner started, it shuts that cluster down, starts a fresh local one and
  submits the runs in flight again (each counts as a retry, as after a worker's death);
- on ``--address``, it has said in the terminal that it waits for the cluster, with the time left;
  then it raises :class:`CapacityLost`, and the launch tells those trials FAIL (queued again for
  the next launch), closes their MLflow runs and exits with one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from tuner.errors import ClusterError
from tuner.records import RunRecord, RunSpec, RunStatus

if TYPE_CHECKING:
    from tuner.driver.executor import ClusterConfig, RayExecutor

log = logging.getLogger(__name__)
CHECK_EVERY = 2.0  # seconds between two looks at the cluster while runs are in flight


class CapacityLost(ClusterError):
    """No node of the joined cluster could host a run for the whole placement timeout."""

    exit_code = 5


class Watched:
    """An executor (``tuner.driver.outcome.Executor``) whose runs never wait forever for a node (module docs)."""

    def __init__(self, make: Callable[[], RayExecutor], address: str | None, timeout: float,
                 say: Callable[[str], None] = print) -> None:
        self._make, self.address, self.timeout, self.say = make, address, timeout, say
        self.inner = make()
        self.restarts = 0
        self._flight: dict[tuple[int, int, str], RunSpec] = {}  # (trial, seed, phase) -> the run's spec
        self._since: float | None = None  # when no node could host a run, first seen
        self._checked = time.monotonic()
        self._told = 0.0  # when the terminal was last told how long it waits

    @property
    def slots(self) -> int:
        return int(self.inner.slots)

    @property
    def workers(self) -> dict[int, dict[str, object]]:
        return dict(self.inner.workers)

    def free(self) -> int:
        return int(self.inner.free())

    def submit(self, spec: RunSpec) -> None:
        self._flight[(spec.trial, spec.seed, spec.phase.value)] = spec
        self.inner.submit(spec)

    def cancel(self, trial: int) -> None:
        self.inner.cancel(trial)

    def poll(self, timeout: float) -> list[RunRecord]:
        records: list[RunRecord] = self.inner.poll(timeout)
        for record in records:
            if record.final:
                self._flight.pop((record.trial, record.seed, record.phase.value), None)
        if records or not self._flight:
            self._since = None
        elif time.monotonic() - self._checked >= CHECK_EVERY:
            records += self._check()
        return records

    def close(self) -> None:
        self.inner.close()

    def _check(self) -> list[RunRecord]:
        """Look at the cluster; act once no node could host a run for ``timeout`` seconds."""
        now = self._checked = time.monotonic()
        if can_host(self.inner.config):
            if self._since is not None:
                self.say("a Ray node can host the runs again: carrying on")
            self._since = None
            return []
        if self._since is None:
            self._since = now
            what = "starting a fresh embedded cluster" if self.address is None else "stopping the launch"
            self.say(f"no alive Ray node can host a seed run ({len(self._flight)} run(s) waiting); "
                     f"{what} if none can within {self.timeout:.0f} s")
        left = self.timeout - (now - self._since)
        if left > 0:
            if self.address is not None and now - self._told >= 30:
                self._told = now
                self.say(f"waiting for the Ray cluster at {self.address} to come back: {left:.0f} s left")
            return []
        if self.address is not None:
            raise CapacityLost(
                f"no node of the Ray cluster at {self.address} could host a seed run for {self.timeout:.0f} s "
                f"({len(self._flight)} run(s) could not be placed): the trials in flight are marked FAIL and queued "
                "again; bring the cluster's nodes back (ray status), then run the same command"
            )
        return self._restart()

    def _restart(self) -> list[RunRecord]:
        """A fresh embedded cluster; the runs in flight again, or FAILED past their retries."""
        specs = list(self._flight.values())
        self.say(f"restarting the embedded Ray cluster: its node is gone; {len(specs)} run(s) start again")
        try:
            self.inner.close()
        except Exception as exc:  # a dead cluster may not shut down cleanly: the new one does not need it
            log.warning("the lost cluster did not shut down cleanly: %s", exc)
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.inner = self._make()
        self.restarts += 1
        self._since, self._flight = None, {}
        failed = []
        for spec in specs:
            retry = replace(spec, attempt=spec.attempt + 1)
            if retry.attempt > self.inner.config.max_retries:
                failed.append(RunRecord(spec.trial, spec.seed, 0, RunStatus.FAILED, final=True, phase=spec.phase,
                                        error=f"its node was lost ({retry.attempt} attempts)"))
            else:
                self.submit(retry)
        return failed


def can_host(config: ClusterConfig) -> bool:
    """Whether an alive node of the connected cluster has the resources of one seed run."""
    import ray

    try:
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    except Exception as exc:  # the cluster does not answer: it cannot host anything now
        log.debug("ray.nodes() failed: %s", exc)
        return False
    cpus, gpus = config.cpus_per_trial, config.gpus_per_trial
    return any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in nodes)
