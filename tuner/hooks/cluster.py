"""Ray's private API (see :mod:`tuner.hooks`): the embedded cluster's monitor, its loopback
address, and its processes in a process group of their own."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


def stop_ray_monitor() -> None:
    """Kill the embedded cluster's autoscaler monitor before ``ray.shutdown``.

    ``ray.shutdown`` stops the GCS first and then sends the monitor SIGTERM, on which it tries to
    report its own end to the GCS that is gone: it takes 1 s to give up, a second added to the end
    of every launch. A local cluster has nothing to autoscale, so the monitor is killed outright.
    Ray's node internals are private: if they change, this does nothing (said at debug level) and
    the shutdown just takes that second.
    """
    import ray

    try:
        node = ray._private.worker._global_node
        kind = ray._private.ray_constants.PROCESS_TYPE_MONITOR
        monitors: list[Any] = node.all_processes.get(kind, []) if node else []
        for info in monitors:
            info.process.kill()
            info.process.wait(timeout=5)
    except Exception as exc:  # the shutdown goes on without it
        log.debug("could not stop the autoscaler monitor first: %s", exc)


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While in this block, ``ray.init(_node_ip_address="127.0.0.1")`` keeps 127.0.0.1 as the node's address.

    ``ray.init`` passes ``_node_ip_address`` through ``services.resolve_ip_for_localhost``, which
    replaces a loopback address with the machine's external one (a node must be reachable from
    others); an embedded cluster has no other node, and on the loopback address Ray binds its
    GCS, raylet, workers, agents and metrics endpoints to 127.0.0.1. Fails open: if Ray has no
    such function, nothing is changed (said at debug level) and the cluster listens as Ray's
    default does.
    """
    import ray._private.services as services

    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if not callable(resolve):
        log.debug("ray has no services.resolve_ip_for_localhost: the embedded cluster listens on all interfaces")
        yield
        return
    setattr(services, "resolve_ip_for_localhost", _keep_loopback(resolve))  # noqa: B010 (typed as Ray's function)
    try:
        yield
    finally:
        setattr(services, "resolve_ip_for_localhost", resolve)  # noqa: B010


def _keep_loopback(resolve: Callable[[str], str]) -> Callable[[str], str]:
    def keep(host: str) -> str:
        return host if host in ("127.0.0.1", "::1", "localhost") else resolve(host)

    return keep



def ray_processes_in_own_group() -> None:
    """Start the processes of an embedded Ray cluster (GCS, raylet, and through it the workers and
    agents) in a process group of their own, so that a signal sent to the launch's process group
    (SIGTERM from ``kill -- -PGID``, SIGHUP from a closed terminal) reaches only the driver, which
    cleans up and then stops them. Ray blocks SIGINT in them already (a terminal's Ctrl-C); for
    SIGTERM and SIGHUP it does not, so the raylet died at once, the driver's core worker aborted
    (exit 134) and the trials stayed RUNNING. They still die with the driver (Ray's fate sharing,
    ``PR_SET_PDEATHSIG``, does not depend on the group).

    Wraps Ray's private ``ray._private.services.ConsolePopen`` (through which
    ``start_ray_process`` starts every process) to add ``process_group=0``. Fails open: without it
    a signal to the whole process group stops the launch as before this hook (exit 134, trials
    left to the next launch's grace period).
    """
    try:
        from ray._private import services

        popen = services.ConsolePopen
    except (ImportError, AttributeError) as exc:
        log.debug("Ray's processes stay in the launch's process group: %s", exc)
        return
    if getattr(popen, "_tuner_own_group", False):
        return

    class OwnGroupPopen(popen):  # type: ignore[misc, valid-type]
        _tuner_own_group = True

        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    setattr(services, "ConsolePopen", OwnGroupPopen)  # noqa: B010  (a module attribute Ray reads at call time)
