"""Two checkouts of anychip timed against each other, in alternate processes: the whole
models of ``bench/cpu_models.py``, a session's median run time per model and round, then the
median over the rounds and the ratio new/old, with their geometric mean.

    git worktree add /tmp/old REV
    python bench/ab_revisions.py --old /tmp/old [--new .] [--threads 2] [--rounds 3]
        [--models squeezenet,resnet50]

``--old-python`` / ``--new-python`` run a side with another interpreter: one checkout in two
environments, e.g. a plain ``pip install anychip`` (the base dependencies) against the full one
(issue 43: the default install within 5% of the full install's times). ``--threads 0`` leaves
the threads as the environment gives them (no ``threadpoolctl``, which the base install lacks).

Each process imports one checkout as ``anychip`` (a temporary directory holding an
``anychip`` link to it, first on ``PYTHONPATH``) and times every model in turn (15-200 runs
after 5 warm-up runs, about two seconds a model); old and new alternate round by round, so a
slow spell of the machine falls on both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["time_models", "main"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def time_models(names: list[str], threads: int) -> dict[str, float]:
    """Median ms of a run per model, for the ``anychip`` this process imports."""
    import anychip

    try:
        from anychip.cli.bench import _thread_limit
    except ImportError:  # a checkout from before the cli/ package (anychip/bench_cli.py)
        from anychip.bench_cli import _thread_limit  # type: ignore[no-redef]

    sys.path.insert(0, _HERE)
    from cpu_models import build

    out = {}
    for name in names:
        model, feeds = build(name)
        with _thread_limit(threads or None):
            sess = anychip.load(model, devices=["cpu"])
            t0 = time.perf_counter()
            sess.run(None, feeds)
            runs = max(15, min(200, int(2.0 / max(time.perf_counter() - t0, 1e-4))))
            for _ in range(5):
                sess.run(None, feeds)
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                sess.run(None, feeds)
                times.append(time.perf_counter() - t)
        out[name] = statistics.median(times) * 1e3
    return out


def _child(
    checkout: str, names: list[str], threads: int, python: str = sys.executable
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(os.path.abspath(checkout), os.path.join(tmp, "anychip"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]))
        code = (
            f"import json, sys; sys.path.insert(0, {_HERE!r}); import anychip; "
            f"assert anychip.__file__.startswith({tmp!r}), anychip.__file__; "
            f"import ab_revisions as m; print(json.dumps(m.time_models({names!r}, {threads})))"
        )
        done = subprocess.run(
            [python, "-c", code], env=env, capture_output=True, text=True, check=True
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, _HERE)
    from cpu_models import MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the other checkout's root (the package)")
    ap.add_argument("--new", default=os.path.dirname(_HERE))
    ap.add_argument("--old-python", default=sys.executable, help="the old side's interpreter")
    ap.add_argument("--new-python", default=sys.executable, help="the new side's interpreter")
    ap.add_argument("--threads", type=int, default=2, help="0: as the environment gives")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    for tag in ("old", "new"):
        root = getattr(args, tag)
        if not os.path.isfile(os.path.join(root, "__init__.py")):
            ap.error(f"--{tag} {root!r} is not an anychip checkout (no __init__.py at its root)")
    names = [m for m in args.models.split(",") if m]
    if unknown := [m for m in names if m not in MODELS]:
        ap.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    got: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        # old first in even rounds, new first in odd ones: the first process of a round ran
        # slower (the base install read 1.049x the full one's time taken first, 0.938x second)
        for tag in ("old", "new") if r % 2 == 0 else ("new", "old"):
            python = getattr(args, f"{tag}_python")
            got[tag].append(_child(getattr(args, tag), names, args.threads, python))
            print(f"round {r + 1}/{args.rounds} {tag} done", file=sys.stderr, flush=True)
    ratios = []
    print(f"{'model':16s} {'old ms (rounds)':>26s} {'new ms (rounds)':>26s} {'new/old':>8s}")
    for m in names:
        old, new = [g[m] for g in got["old"]], [g[m] for g in got["new"]]
        ratios.append(statistics.median(new) / statistics.median(old))
        print(
            f"{m:16s} {' / '.join(f'{v:.2f}' for v in old):>26s} "
            f"{' / '.join(f'{v:.2f}' for v in new):>26s} {ratios[-1]:8.3f}"
        )
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"geomean new/old {geo:.3f}; threads {args.threads}, {args.rounds} rounds")


if __name__ == "__main__":
    main()
