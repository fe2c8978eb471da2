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

A process may end before its calibration does (a short script: 5-10 s of probes per device).
Each probe measured goes to ``<calibration file>.partial`` (``PartialFile``) as it is done, and
the next process's background calibration takes them as they are and measures only the rest:
a device is calibrated after enough short processes, not never. Placement reads only the
complete file, so the placement still changes once, when the calibration is complete.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from anychip.core.plan.calibration import (
    FORMAT,
    STOP,
    Calibration,
    CalibrationStopped,
    _lock,
    _path,
    _save,
    cache_key,
    calibrate,
    load_calibration,
)

__all__ = ["PartialFile", "measure_in_background"]

#: Probes kept for the next process this long at most (s): older ones are measured again.
PARTIAL_TTL = 7 * 24 * 3600.0


class PartialFile:
    """The probes of an interrupted calibration of ``backend``, beside its calibration file:
    ``get``/``put`` per (sweep, key), each ``put`` written at once (atomic rename), the file
    ignored when it is another key's, another format's or older than ``PARTIAL_TTL``."""

    def __init__(self, backend: Any) -> None:
        self.path = Path(str(_path(backend)) + ".partial")
        self.key = cache_key(backend)
        self.done: dict[str, list[tuple[float, float]]] = {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            fresh = time.time() - float(data["when"]) < PARTIAL_TTL
            if data["format"] == FORMAT and data["key"] == self.key and fresh:
                self.done = {
                    str(k): [(float(w), float(t)) for w, t in v] for k, v in data["done"].items()
                }
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):  # corrupt: measured again
            self.path.unlink(missing_ok=True)
        self.resumed = len(self.done)

    def get(self, sweep: int, key: str) -> list[tuple[float, float]] | None:
        return self.done.get(f"{sweep}:{key}")

    def put(self, sweep: int, key: str, points: list[tuple[float, float]]) -> None:
        self.done[f"{sweep}:{key}"] = list(points)
        data = {"format": FORMAT, "key": self.key, "when": time.time(), "done": self.done}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


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
    partial = PartialFile(backend)
    try:
        cal = calibrate(backend, since=since, save=False, progress=partial)
    except CalibrationStopped:  # the process is exiting: what was measured is in ``partial``
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
    partial.remove()


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
