"""Calibration in the background: a load never waits for a device to be measured.

``calibration.calibrations`` (what a load asks) starts ``measure_in_background`` for a device
with no calibration here, and places on what the cache holds (a new device's declared figures,
which placement does not trust: decisions/032). The thread measures without holding the
calibration lock, then saves under it unless a calibration appeared meanwhile (another
process's, or ``anychip calibrate``'s: the first complete one stays). One thread per device
and cache file at a time (the file is written under a temporary name and renamed: an
interrupted one leaves nothing). At interpreter exit the threads are stopped after the probe
call in flight and joined (``_stop_at_exit``): a device runtime still compiling or running a
probe while the interpreter finalizes aborted the process ("terminate called without an
active exception", OpenVINO's CPU plugin beside anychip's CPU session).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from anychip.core.plan.calibration import (
    STOP,
    Calibration,
    CalibrationStopped,
    _lock,
    _path,
    _save,
    calibrate,
    load_calibration,
)

__all__ = ["measure_in_background"]

_running: dict[str, threading.Thread] = {}
_running_lock = threading.Lock()


def measure_in_background(backend: Any, since: Calibration | None = None) -> threading.Thread:
    """Calibrate ``backend`` in a daemon thread (one at a time per device and cache file) and
    cache the figures; the thread (``join`` it to wait). Placements meanwhile use what the
    cache holds."""
    key = str(_path(backend))
    with _running_lock:
        running = _running.get(key)
        if running is not None and running.is_alive():
            return running
        t = threading.Thread(
            target=_measure_and_merge,
            args=(backend, since),
            name=f"anychip-calibrate-{backend.name}",
            daemon=True,
        )
        _running[key] = t
        t.start()
        return t


def _measure_and_merge(backend: Any, since: Calibration | None) -> None:
    """Measure without holding ``_lock``, then save under it unless a calibration was saved
    meanwhile (the first complete one stays: placements must not change under the user)."""
    try:
        cal = calibrate(backend, since=since, save=False)
    except CalibrationStopped:  # the process is exiting: nothing to say, nothing saved
        return
    except Exception as e:  # a thread's end: said in the log, the declared figures stay
        logging.getLogger("anychip").warning(
            "anychip: calibrating %s in the background failed (%s); its declared figures are used",
            backend.name,
            e,
        )
        return
    with _lock:
        if load_calibration(backend) is None:
            _save(backend, cal)


#: How long exit waits for a calibration thread to finish its probe call in flight (s).
EXIT_WAIT = 30.0


def _stop_at_exit() -> None:
    """Stop every calibration thread after its current probe call, and wait for it."""
    STOP.set()
    with _running_lock:
        threads = list(_running.values())
    for t in threads:
        t.join(EXIT_WAIT)


atexit.register(_stop_at_exit)
