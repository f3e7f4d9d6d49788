"""A Ctrl-C that Python drops (it landed in a __del__ or weakref callback) is raised at the next poll.
The real case, a launch's process group sent SIGINT: tests/test_fault_matrix.py."""

from __future__ import annotations

import os
import signal

import pytest

from tuner.driver import ctrl_c


class _Dropper:
    """Sends this process SIGINT from its __del__, where Python drops the KeyboardInterrupt."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # the handler runs between these bytecodes
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop, on purpose
def test_a_dropped_ctrl_c_is_raised_at_the_next_poll_and_the_handler_is_restored() -> None:
    restore = ctrl_c.noted()
    try:
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        ctrl_c.raise_if_dropped()  # nothing came: nothing raised
        dropper = _Dropper()
        del dropper  # "Exception ignored in ... __del__": KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.raise_if_dropped()
        ctrl_c.raise_if_dropped()  # raised once
    finally:
        restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

