"""Stop signals: Ctrl-C (SIGINT), SIGTERM (``docker stop``, Kubernetes, systemd, Slurm) and SIGHUP
(the terminal closed, ssh dropped) stop a launch the same way.

While :func:`noted` holds, each of them raises :class:`Stopped` (a KeyboardInterrupt, so every
``except KeyboardInterrupt`` of the driver treats them alike) and the launch's cleanup runs: trials
in flight FAIL and are queued again, their MLflow runs and the launch run are closed (KILLED), one
``tuner:`` line says what was kept, and the exit status is 128 + the signal (130, 143, 129).

Four things stand in the way, each handled here:

- Python runs a signal handler between two bytecodes of the main thread, and that can be inside a
  weakref callback or a ``__del__`` (SQLAlchemy's, which Optuna's and MLflow's stores run often in
  the driver). An exception raised there is printed as "Exception ignored in ..." and goes no
  further. So the signal is also noted, and the driver's loops call :func:`raise_if_dropped` after
  each poll (at most 0.5 s apart), which raises it again; the dropped one is not printed
  (``sys.unraisablehook``).
- ``ray.init`` sets its own SIGTERM handler (``sys.exit(15)``: exit 15, "SystemExit") and Ray's
  C++ core worker then installs a crash handler that prints a stack dump (``*** SIGTERM received
  ... PC: @``). :func:`raise_if_dropped` puts tuner's handler back when Ray has replaced it (a
  restarted embedded cluster too); installing it replaces the C++ one.
- After SIGHUP the terminal may be gone: writing to it fails (EIO). The descriptors of a hung-up
  terminal are pointed at ``/dev/null``, so the cleanup runs to its end.
- Ray's waits (``ray.wait``, ``ray.get``) run the handler inside their own signal check, catch its
  :class:`Stopped` and raise a new, plain KeyboardInterrupt: :func:`stopped` names it by the signal
  the handler took last, so a SIGHUP there still exits 129, not Ctrl-C's 130.

A second signal while the cleanup runs (:func:`cleaning`) ends the process at once with one line:
what the cleanup had done by then stays done, and a trial it had not reached yet is failed and
queued again by the next launch once its heartbeat is older than ``--grace-period``.

The command line (never the Python API: a notebook's kernel is not ended) also bounds the time from
the first signal to the end of the process (:func:`exit_within`): a cleanup or an interpreter exit
that hangs (a cluster that does not shut down) cannot keep a closed terminal's launch, or a stopped
container, alive; the process ends as after a second signal, with the threads' stacks on standard
error to say where it hung.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}

_noted: int | None = None  # the signal that came while no Stopped was seen to leave a poll since
_last: int | None = None  # the last signal tuner's handler took (Ray turns its Stopped into a plain KeyboardInterrupt)
_installed = False  # tuner's handlers are in place (between noted() and its restore)
_cleaning = False  # the launch is cleaning up: another signal ends the process at once
_limit_s: float | None = None  # exit_within's bound on the time from a stop signal to the end of the process
_deadline: threading.Timer | None = None  # armed by the first stop signal when _limit_s is set


class Stopped(KeyboardInterrupt):
    """A stop signal came (see the module docs); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """How the signal is named to the user: ``Ctrl-C``, ``SIGTERM``, ``SIGHUP``."""
        return _NAMES.get(signal.Signals(self.signum), signal.Signals(self.signum).name)

    @property
    def exit_code(self) -> int:
        """The documented exit status: 128 + the signal, as a shell reports a process it ended."""
        return 128 + self.signum

    @property
    def reason(self) -> str:
        """The reason recorded on the trials it stopped."""
        if self.signum == signal.SIGINT:
            return "interrupted (Ctrl-C)"
        if self.signum == signal.SIGHUP:
            return "stopped by SIGHUP (the terminal closed)"
        return f"stopped by {self.name}"


def is_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is a stop signal: a KeyboardInterrupt, or the ``SystemExit(15)`` that the SIGTERM
    handler ``ray.init`` installs raises (a SIGTERM while Ray starts, before tuner's handler is back)."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, SystemExit) and exc.code == signal.SIGTERM)


def stopped(exc: BaseException) -> Stopped:
    """``exc`` (a stop signal: :func:`is_stop`) as a :class:`Stopped`. A plain KeyboardInterrupt is the
    signal tuner's handler took last: Ray's waits (``ray.wait``, ``ray.get``) run the handler inside
    their own signal check and raise a new, plain KeyboardInterrupt in place of its :class:`Stopped`
    (a SIGHUP then read as Ctrl-C: exit 130, not 129); with none taken (Python's own handler), Ctrl-C."""
    if isinstance(exc, Stopped):
        return exc
    if isinstance(exc, SystemExit):
        return Stopped(signal.SIGTERM)
    return Stopped(_last if _last is not None else signal.SIGINT)


def _handler(signum: int, frame: FrameType | None) -> None:
    global _noted, _last
    if _cleaning:
        _at_once(signum)
    if signum == signal.SIGHUP:
        _leave_hung_up_terminal()
    _arm_deadline(signum)
    _noted = _last = signum
    raise Stopped(signum)


def exit_within(seconds: float) -> None:
    """After the first stop signal, the process ends within ``seconds`` even if its cleanup hangs (the
    command line's choice: a process that is not the user's own, such as a notebook's, is never ended)."""
    global _limit_s
    _limit_s = seconds


def _arm_deadline(signum: int) -> None:
    global _deadline
    if _limit_s is None or _deadline is not None:
        return
    _deadline = threading.Timer(_limit_s, _overdue, args=(signum, _limit_s))
    _deadline.daemon = True
    _deadline.name = "tuner-stop-deadline"
    _deadline.start()


def _overdue(signum: int, limit_s: float) -> None:
    """The cleanup after ``signum`` has not ended within ``limit_s``: where each thread is, one line, exit."""
    name = _NAMES.get(signal.Signals(signum), signal.Signals(signum).name)
    with contextlib.suppress(OSError, ValueError):
        os.write(2, f"the cleanup after {name} hung; where each thread was:\n".encode())
        faulthandler.dump_traceback(file=2, all_threads=True)
    with contextlib.suppress(OSError):
        os.write(2, f"tuner: {name}: the cleanup did not end within {limit_s:g} s: stopped at once; a trial not "
                    "yet failed is failed and queued again by the next launch after --grace-period\n".encode())
    os._exit(128 + signum)


def _at_once(signum: int) -> None:
    """A second signal during the cleanup: one line, and the process ends now."""
    name = _NAMES.get(signal.Signals(signum), signal.Signals(signum).name)
    with contextlib.suppress(OSError):
        os.write(2, f"tuner: {name} during the cleanup: stopped at once; a trial not yet failed is failed and "
                    "queued again by the next launch after --grace-period\n".encode())
    os._exit(128 + signum)


def _leave_hung_up_terminal() -> None:
    """Point standard input, output and error at /dev/null where they are a terminal that hung up."""
    for fd in (0, 1, 2):
        try:
            termios.tcgetattr(fd)  # EIO once the terminal hung up; ENOTTY for a file or a pipe
        except termios.error as exc:
            if exc.args and exc.args[0] == 5:  # EIO
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, fd)
                os.close(null)


def _install() -> None:
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup'd SIGHUP, a background job's SIGINT: theirs
            signal.signal(signum, _handler)


def noted() -> Callable[[], None]:
    """Install the stop handlers (main thread only; elsewhere nothing); return what restores the
    handlers before them."""
    global _noted, _installed, _last
    _noted = _last = None
    if threading.current_thread() is not threading.main_thread() or _installed:
        return lambda: None
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _install()
    _installed = True
    previous_hook = sys.unraisablehook

    def quiet(unraisable: sys.UnraisableHookArgs) -> None:  # the dropped Stopped: no traceback, raised at the poll
        if not (_noted is not None and issubclass(unraisable.exc_type, KeyboardInterrupt)):
            previous_hook(unraisable)

    sys.unraisablehook = quiet

    def restore() -> None:
        global _noted, _installed, _cleaning  # _last stays: the caller may name the stop after this
        _noted, _installed, _cleaning = None, False, False
        for signum, handler in previous.items():
            if signal.getsignal(signum) is _handler:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if sys.unraisablehook is quiet:
            sys.unraisablehook = previous_hook

    return restore


def raise_if_dropped() -> None:
    """Raise :class:`Stopped` if a signal came since the last call and its exception was dropped;
    put tuner's handlers back where another library (``ray.init``) replaced them."""
    global _noted
    if _installed and threading.current_thread() is threading.main_thread() and any(
            signal.getsignal(s) not in (_handler, signal.SIG_IGN) for s in SIGNALS):
        _install()
    if _noted is not None:
        signum, _noted = _noted, None
        raise Stopped(signum)


@contextlib.contextmanager
def cleaning() -> Iterator[None]:
    """While the launch cleans up after a stop, a second signal ends the process at once."""
    global _cleaning, _noted
    _cleaning, _noted = True, None
    try:
        yield
    finally:
        _cleaning = False
