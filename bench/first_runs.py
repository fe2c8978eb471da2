"""Each of a session's first runs timed, for a few fresh sessions in one process: where the
one-time work of the first runs falls (kernels' first paths, the replay's recording steps).

    python bench/first_runs.py squeezenet hf_bert_tiny [--runs 12] [--sessions 3]

Models are ``bench/cpu_models.py``'s names; the CPU alone, thread choice off (its probes
would move runs between thread counts). Prints one line of ms per session and the replay's
state at its end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv: list[str] | None = None) -> None:
    import anychip
    from bench.cpu_models import MODELS, build

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", choices=sorted(MODELS))
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--sessions", type=int, default=3)
    args = ap.parse_args(argv)
    for name in args.models:
        model, feeds = build(name)
        for _ in range(args.sessions):
            opts = {"cpu": {"thread_choice": False}}
            with anychip.load(model, devices=["cpu"], device_options=opts) as sess:
                times = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    sess.run(None, feeds)
                    times.append((time.perf_counter() - t0) * 1e3)
                state = sess.partitions[0].info.get("replay", "no replay")
            print(name, " ".join(f"{t:7.2f}" for t in times), f"| {state[:60]}", flush=True)


if __name__ == "__main__":
    main()
