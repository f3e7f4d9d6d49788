"""A Ctrl-C that Python drops is raised again at the driver's next poll.

Python runs a signal handler between two bytecodes of the main thread, and that can be inside a
weakref callback or a ``__del__`` (SQLAlchemy's, which Optuna's and MLflow's stores run often in
the driver). A KeyboardInterrupt raised there is printed as "Exception ignored in ..." and goes no
further: the launch would train on to its end as if no Ctrl-C came (seen in
tests/test_fault_matrix.py). So while :func:`noted` holds, SIGINT raises KeyboardInterrupt as
Python's own handler does and is also noted; the driver's loops call :func:`raise_if_dropped`
after each poll (at most 0.5 s apart), which raises it again if it was dropped; the dropped one is
not printed (``sys.unraisablehook``), so a Ctrl-C shows no traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

_noted = False  # a SIGINT came and no KeyboardInterrupt was seen to leave a poll since


def _handler(signum: int, frame: Any) -> None:
    global _noted
    _noted = True
    raise KeyboardInterrupt


def noted() -> Callable[[], None]:
    """Install the noting SIGINT handler (main thread only; elsewhere nothing); return what restores
    the handler before it."""
    global _noted
    _noted = False
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(
            signal.SIGINT) is not signal.default_int_handler:
        return lambda: None  # SIGINT ignored, or a caller's own handler: theirs to keep
    signal.signal(signal.SIGINT, _handler)
    previous_hook = sys.unraisablehook

    def quiet(unraisable: Any) -> None:  # the dropped KeyboardInterrupt: no traceback, raised at the poll
        if not (_noted and unraisable.exc_type is KeyboardInterrupt):
            previous_hook(unraisable)

    sys.unraisablehook = quiet

    def restore() -> None:
        global _noted
        _noted = False
        if signal.getsignal(signal.SIGINT) is _handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if sys.unraisablehook is quiet:
            sys.unraisablehook = previous_hook

    return restore


def raise_if_dropped() -> None:
    """Raise KeyboardInterrupt if a SIGINT came since the last call and its KeyboardInterrupt was
    dropped (a KeyboardInterrupt that was not dropped left the loop that would call this)."""
    global _noted
    if _noted:
        _noted = False
        raise KeyboardInterrupt
