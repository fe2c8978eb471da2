"""Run as a script by ``test_fork.py``: set up a session in one way, fork, and report what the
child could do as one JSON line (the parent kills a child that hangs)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

import anychip
from anychip.zoo import light_model


def _child(case: str, model: object, feeds: dict, want: np.ndarray, old: object) -> dict:
    out: dict = {}
    try:
        old.run(None, feeds)  # type: ignore[attr-defined]
        out["old"] = "ran"
    except anychip.DeviceError as e:
        out["old"] = "DeviceError: " + str(e)
    for devices in ([case, "cpu"] if case in ("opencl", "xpu", "npu") else [], ["cpu"]):
        if not devices:
            continue
        key = ",".join(devices)
        try:
            y = anychip.load(model, devices=devices, cost_model=False).run(None, feeds)[0]
            out[key] = "same" if np.allclose(y, want, rtol=1e-3, atol=1e-3) else "differs"
        except anychip.DeviceError as e:
            out[key] = "DeviceError: " + str(e)
    return out


def main(case: str) -> None:
    model = light_model("squeezenet", seed=1)
    x = np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)
    devices = [case, "cpu"] if case in ("opencl", "xpu", "npu") else ["cpu"]
    sess = anychip.load(model, devices=devices, cost_model=False, background_compile=False)
    feeds = {sess.get_inputs()[0].name: x}
    want = sess.run(None, feeds)[0]
    stop = threading.Event()
    if case == "thread":  # another thread runs the session while the process forks

        def loop() -> None:
            while not stop.is_set():
                sess.run(None, feeds)

        runner = threading.Thread(target=loop, daemon=True)
        runner.start()
        time.sleep(0.3)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if os.environ.get("FORK_CHILD_TRACE"):  # where a hang sits, for whoever debugs one
            import faulthandler

            faulthandler.dump_traceback_later(20, exit=True)
        try:
            result = _child(case, model, feeds, want, sess)
        except BaseException as e:  # reported, not raised: the parent reads the pipe
            result = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + float(os.environ.get("FORK_CHILD_TIMEOUT", "60"))
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print(json.dumps({"hung": True}))
        return
    stop.set()
    if case == "thread":  # its run ends before the interpreter does (a daemon thread still
        runner.join(30)  # inside oneDNN at shutdown crashed this parent now and then)
    data = os.read(r, 1 << 16).decode()
    print(
        json.dumps({"hung": False, "exit": os.waitstatus_to_exitcode(status), **json.loads(data)})
    )


if __name__ == "__main__":
    main(sys.argv[1])
