"""A Ctrl-C that Python drops (it landed in a __del__ or weakref callback) is raised at the next poll.
The real case, a launch's process group sent SIGINT: tests/test_fault_matrix.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import terminal_sigint

ROOT = Path(__file__).resolve().parents[1]

# In a fresh interpreter with SIGINT as a terminal gives it (see terminal_sigint), and nothing of pytest's.
SCRIPT = textwrap.dedent("""
    import os, signal
    from tuner.driver import signals

    class Dropper:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):  # the handler runs between these bytecodes: its KeyboardInterrupt is dropped
                pass

    restore = signals.noted()
    signals.raise_if_dropped()  # nothing came: nothing raised
    dropped = True
    dropper = Dropper()
    try:
        del dropper
    except KeyboardInterrupt:  # not dropped: Python raised it here after all
        dropped = False
    try:
        signals.raise_if_dropped()
    except KeyboardInterrupt:
        print("raised at the poll")
    signals.raise_if_dropped()  # raised once
    print("dropped" if dropped else "not dropped")
    restore()
    print("restored" if signal.getsignal(signal.SIGINT) is signal.default_int_handler else "not restored")
""")


def test_a_dropped_ctrl_c_is_raised_at_the_next_poll_and_the_handler_is_restored() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, preexec_fn=terminal_sigint)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr  # the dropped one is not printed either
    assert done.stdout.split() == ["raised", "at", "the", "poll", "dropped", "restored"]


SECOND = textwrap.dedent("""
    import os, signal, time
    from tuner.driver import signals

    signals.noted()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except signals.Stopped as exc:
        print("stopped", exc.name, exc.exit_code, flush=True)
        with signals.cleaning():
            os.kill(os.getpid(), signal.SIGHUP)  # a second signal while the launch cleans up
            time.sleep(5)
            print("cleanup ran on", flush=True)
""")


def test_a_stop_signal_raises_stopped_and_a_second_during_the_cleanup_ends_at_once() -> None:
    done = subprocess.run([sys.executable, "-c", SECOND], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["stopped", "SIGTERM", "143"], done.stderr[-2000:]
    assert done.returncode == 129  # 128 + SIGHUP, at once
    assert done.stderr.startswith("tuner: SIGHUP during the cleanup: stopped at once;"), done.stderr
    assert "Traceback" not in done.stderr


HUNG = textwrap.dedent("""
    import contextlib, io, os, signal, sys, threading
    from tuner.driver import signals

    if sys.argv[1] == "cli":
        from tuner import cli
        cli.STOP_LIMIT_S = 1.0
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            cli.main(["--help"])  # what the command line sets up before it parses
    signals.noted()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(5)
    except signals.Stopped:
        with signals.cleaning():
            def shutting_down_a_cluster_that_hangs():
                threading.Event().wait(3)
            shutting_down_a_cluster_that_hangs()
            print("cleanup ran to its end", flush=True)
""")


@pytest.mark.parametrize("caller", ["cli", "api"])
def test_a_cleanup_that_hangs_ends_the_command_line_within_its_bound_and_never_a_notebook(caller: str) -> None:
    """The command line bounds the time from a stop signal to its exit (tuner.cli.STOP_LIMIT_S) and says
    where the cleanup hung; the Python API's caller (a notebook's kernel) is never ended by tuner."""
    done = subprocess.run([sys.executable, "-c", HUNG, caller], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if caller == "api":
        assert (done.returncode, done.stdout, done.stderr) == (0, "cleanup ran to its end\n", "")
        return
    assert done.returncode == 143 and done.stdout == "", done.stderr
    assert "shutting_down_a_cluster_that_hangs" in done.stderr  # the main thread's stack: where it hung
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("tuner: SIGTERM: the cleanup did not end within 1 s: stopped at once;"), lines
    assert [line for line in lines if line.startswith("tuner:")] == lines[-1:]


RAY_WAIT = textwrap.dedent("""
    import os, signal, time
    from tuner.driver import signals

    def ray_wait():
        # what Ray's ray.wait/ray.get do: the handler runs inside their signal check, which catches its
        # KeyboardInterrupt and raises a new, plain one
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None

    restore = signals.noted()
    try:
        ray_wait()
    except KeyboardInterrupt as exc:
        restore()  # as tuner verify's finally does, before the command line names the stop
        stop = signals.stopped(exc)
        print(type(exc).__name__, stop.name, stop.exit_code, stop.reason, sep="|")
""")


def test_a_stop_that_ray_turned_into_a_plain_keyboardinterrupt_keeps_its_signal() -> None:
    """A SIGHUP during ``ray.wait`` reaches the launch as a plain KeyboardInterrupt: it is still SIGHUP
    (exit 129, the trials' reason), not Ctrl-C (130) (seen in 1 of 21 SIGHUP launches under load)."""
    done = subprocess.run([sys.executable, "-c", RAY_WAIT], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "KeyboardInterrupt|SIGHUP|129|stopped by SIGHUP (the terminal closed)"
