"""Compile budgets: every graph compile ends (issue 47; docs/decisions/050-compile-budget.md).

A graph-mode compile (``Backend.compile`` after the backend's passes, or loading a compiled
artifact) runs under a ``Deadline`` of ``compile_timeout`` seconds (``SessionOptions``; its
default from ``ANYCHIP_COMPILE_TIMEOUT``, else ``DEFAULT_SECONDS``; None: no limit). It ends at
the deadline in one of three ways, whichever the compiler allows:

1. *cooperatively*: the compile runs in a worker thread whose checkpoint
   (``ir/passes/base.checkpoint``, called between passes, fixed-point rounds and the NPU
   compiler's ops) raises ``CompileTimeout``: the thread stops there;
2. *a child process* (IREE's ``iree-compile``, through ``run_tool``) is killed, with its
   process group, and its thread stops;
3. anything else (a compiler in C++ as OpenVINO's, a plugin's ``compile`` that sleeps) is
   *abandoned*: the caller stops waiting at the deadline and its partition goes elsewhere;
   the worker thread (a daemon) finishes when it finishes, and whatever it returns then is
   given back to its backend (``late``), never used.

Either way the caller gets ``CompileTimeout`` naming the compile, the budget and what to do.
At load the partition is placed on the next device (``strict``: the error); in the
background its signature stays on the host, with the reason in the partition's info
(``specialize.py``). ``Deadline.stop`` ends a compile early the same way: a session's
``close()`` stops its background compiles, so it never waits for a hung one.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from anychip.errors import AnychipError, CompileTimeout
from anychip.ir.passes.base import install_checkpoint

__all__ = [
    "DEFAULT_SECONDS",
    "ENV",
    "Deadline",
    "check_timeout",
    "current",
    "default_timeout",
    "run_tool",
    "within",
]

#: The variable that sets the default budget: seconds, or ``none`` (also 0, inf) for no limit.
ENV = "ANYCHIP_COMPILE_TIMEOUT"
#: The default budget of one compile, in seconds: ten times the longest compile seen in the
#: test models (IREE's BERT partition on llvm-cpu, about 30 s on a loaded two-core machine).
DEFAULT_SECONDS = 300.0

T = TypeVar("T")

_local = threading.local()

_WHAT_TO_DO = (
    "raise compile_timeout (SessionOptions, or ANYCHIP_COMPILE_TIMEOUT; None: no limit), or "
    "place the partition on another device"
)


def check_timeout(value: Any, name: str = "compile_timeout") -> float | None:
    """``value`` as a budget in seconds: a number > 0, or None for no limit (inf too).

    Raises:
        AnychipError: anything else, naming ``name``.
    """
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok:  # NaN, 0, negative, a string
        raise AnychipError(
            f"{name} must be a number of seconds > 0, or None for no limit; got {value!r}"
        )
    return None if math.isinf(value) else float(value)


def default_timeout() -> float | None:
    """``ANYCHIP_COMPILE_TIMEOUT`` (seconds; ``none``, ``0`` or ``inf``: no limit), else
    ``DEFAULT_SECONDS``.

    Raises:
        AnychipError: the variable holds something else.
    """
    raw = os.environ.get(ENV, "").strip().lower()
    if not raw:
        return DEFAULT_SECONDS
    if raw in ("none", "off", "0", "inf"):
        return None
    try:
        return check_timeout(float(raw), ENV)
    except (ValueError, AnychipError):
        raise AnychipError(
            f"{ENV}={raw!r}: give the seconds one compile may take (e.g. 300), or 'none' "
            "for no limit"
        ) from None


class Deadline:
    """The budget of one compile: ``seconds`` from its creation (None: no limit), or until
    ``stop``. Thread-safe: the waiting caller, the worker and ``close()`` share it."""

    def __init__(self, seconds: float | None, what: str) -> None:
        self.seconds = seconds
        #: The compile, for messages: ``"compile of partition 0 on npu"``.
        self.what = what
        self.end = None if seconds is None else time.monotonic() + seconds
        #: Why it ended early (None while it runs): ``"after its 30.0 s budget"``.
        self.reason: str | None = None
        #: Set when the compile finished or the deadline was stopped.
        self.wake = threading.Event()
        #: The thread running the compile (``within``): ``close()`` gives it a moment to stop.
        self.worker: threading.Thread | None = None
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def remaining(self) -> float | None:
        """Seconds left (never below 0), or None without a limit."""
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    def spent(self) -> bool:
        """Whether the compile must stop (the budget is spent, or ``stop`` was called)."""
        if self.reason is None and self.end is not None and time.monotonic() >= self.end:
            self.stop(f"after its {_seconds(self.seconds or 0.0)} s budget")
        return self.reason is not None

    def check(self, where: str = "") -> None:
        """Raise ``CompileTimeout`` when spent (the checkpoint the worker thread installs)."""
        if self.spent():
            raise self.error(where)

    def error(self, where: str = "") -> CompileTimeout:
        """The error of a spent deadline: what was abandoned, why, where, what to do."""
        at = f" (it was in {where})" if where else ""
        return CompileTimeout(
            f"{self.what} abandoned {self.reason}{at}; {_WHAT_TO_DO}", seconds=self.seconds
        )

    def stop(self, reason: str) -> None:
        """End the compile now: its child processes are killed, its waiter wakes."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
            procs = list(self._procs)
        for proc in procs:
            _kill(proc)
        self.wake.set()

    def stop_and_wait(self, reason: str, grace: float) -> bool:
        """``stop``, then wait up to ``grace`` seconds for the compile's thread to end (a
        cooperative compile stops at its next checkpoint and gives back what it made);
        True when it ended."""
        self.stop(reason)
        worker, end = self.worker, time.monotonic() + grace
        if worker is None or worker is threading.current_thread():
            return True
        while worker.ident is None and time.monotonic() < end:  # being started (or never:
            time.sleep(0.001)  # within() saw the stop first)
        if worker.ident is not None:
            worker.join(max(0.0, end - time.monotonic()))
        return not worker.is_alive()

    def track(self, proc: subprocess.Popen) -> None:
        """Kill ``proc`` when the deadline is spent (at once when it already is)."""
        with self._lock:
            self._procs.append(proc)
            stopped = self.reason is not None
        if stopped:
            _kill(proc)

    def untrack(self, proc: subprocess.Popen) -> None:
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)


def _seconds(value: float) -> str:
    """30.0, 2.5, 0.05: a budget as the report shows it."""
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _kill(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group (its own session: the tool's children too)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone, or not a group leader
        try:
            proc.kill()
        except OSError:
            pass


def current() -> Deadline | None:
    """The deadline of the compile this thread runs, or None."""
    return getattr(_local, "deadline", None)


def within(deadline: Deadline, fn: Callable[[], T], late: Callable[[T], None] | None = None) -> T:
    """``fn()`` in a worker thread under ``deadline``; its result, or its exception.

    Raises:
        CompileTimeout: the deadline was spent or stopped before ``fn`` returned; the worker
            stops at its next checkpoint or when its child process is killed, else is left to
            finish, and ``late(result)`` then gives back what it made.
    """
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def work() -> None:
        _local.deadline = deadline
        install_checkpoint(deadline.check)
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller, who re-raises it
            box["error"] = e
        finally:
            install_checkpoint(None)
            _local.deadline = None
        with lock:
            box["done"] = True
            abandoned = box.get("abandoned", False)
        deadline.wake.set()
        if abandoned and "value" in box and late is not None:
            late(box["value"])

    # A background compile's worker keeps its thread's name: backends tell a background
    # compile by it (IREE's checks the partition at its first run then, not beside the host's)
    name = threading.current_thread().name
    name = name if name == "anychip-compile" else "anychip-compile-worker"
    worker = deadline.worker = threading.Thread(target=work, name=name, daemon=True)
    if deadline.spent():  # stopped before it began (its session closed): nothing to run
        deadline.worker = None
        raise deadline.error()
    worker.start()
    try:  # woken by the worker's end or a stop; past the end, spent() kills and stops
        while not deadline.wake.wait(deadline.remaining()) and not deadline.spent():
            pass
    except BaseException:  # an interrupted load: the compile stops too
        deadline.stop("because the load was interrupted")
        raise
    with lock:
        if not box.get("done"):
            box["abandoned"] = True
            raise deadline.error()
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_tool(command: Sequence[str], stdin: bytes) -> subprocess.CompletedProcess:
    """``command`` as a child process fed ``stdin``, killed when this thread's deadline is
    spent, or, outside a compile (IREE's capability probes), after ``default_timeout()``;
    then ``CompileTimeout``. Its completed process otherwise, whatever its exit code."""
    deadline = current()
    limit = default_timeout() if deadline is None else None
    tool = os.path.basename(str(command[0]))
    proc = subprocess.Popen(
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: killed with its children
    )
    if deadline is not None:
        deadline.track(proc)
    try:
        out, err = proc.communicate(stdin, timeout=limit)
    except subprocess.TimeoutExpired:
        raise CompileTimeout(
            f"{tool} killed after its {_seconds(limit or 0)} s budget; {_WHAT_TO_DO}",
            seconds=limit,
        ) from None
    finally:
        if deadline is not None:
            deadline.untrack(proc)
        if proc.poll() is None:  # interrupted or past its limit: never leave the tool running
            _kill(proc)
            proc.wait()
    if deadline is not None and deadline.reason is not None and proc.returncode != 0:
        raise deadline.error(tool)
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)
