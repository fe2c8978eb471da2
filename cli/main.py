"""The ``anychip`` command (also ``python -m anychip``).

anychip devices [--json [FILE]]          backends, availability, and why not
anychip run MODEL [--devices npu,cpu] [--shape x=[1,128] ...] [--input name=file.npy|.pb|.npz ...]
                  [--placement] [--repeat N] [--concurrency N] [--profile prof.html] [--json [FILE]]
                  [--bring-up]
anychip demo [--model NAME]             a light model (ResNet-50) on every available device
anychip partition MODEL [--devices ...] [--shape ...] [--strict] [--json [FILE]] [-o FILE]
anychip inspect MODEL [--shape ...] [--json [FILE]]   opsets, inputs, ops, FLOPs, devices
anychip conformance --device X [--strict] [--ops A,B] [--json [FILE]] [--bring-up]   the kit
anychip bench MODEL... [--against onnxruntime openvino] [--threads N] [--json [FILE]]
anychip calibrate [--device X ...] [--clear]   measure (or forget) each device's costs here
anychip new-backend NAME [--graph-mode] [-o DIR]   a backend package that passes the kit
anychip cache info|clear                 what the cache folder holds (bounded), or clear it
anychip --version                       anychip's, its libraries' and each plugin's versions

--json alone prints JSON on stdout instead of the text; --json FILE writes it there. -q on
every command: no progress, no warnings.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np

from anychip.cli import viz as viz_commands
from anychip.cli.concurrency import concurrency_text, concurrent_runs
from anychip.cli.inputs import read_inputs
from anychip.core.api.feeds import random_feeds
from anychip.viz.terminal import render
from anychip.zoo import LIGHT_MODELS

__all__ = ["main", "random_feeds"]


def _checksum(arr: object) -> str:
    a = np.ascontiguousarray(np.asarray(arr))
    if a.dtype == object:
        return hashlib.sha1(repr(a.tolist()).encode()).hexdigest()[:12]
    return (
        f"sum={float(np.asarray(a, dtype=np.float64).sum()):.6g} sha1="
        + hashlib.sha1(a.tobytes()).hexdigest()[:12]
    )


def _cmd_devices(args: argparse.Namespace) -> int:
    import anychip

    if getattr(args, "ops", None):
        return _cmd_claims(args.ops, args.json)
    rows = anychip.devices(include_failed_plugins=True)
    if viz_commands.emit_json(args, [{k: getattr(d, k) for k in d.__slots__} for d in rows]):
        return 0
    # the last column: why a device is unavailable, else what stands behind it (Backend.about)
    w = max([10, *(len(d.name) for d in rows)])
    print(f"{'device':<{w}} {'kind':<8} {'available':<10} {'kernels':>7}  {'plugin':<10} reason")
    for d in rows:
        kernels = "graph" if d.graph_mode else str(d.kernels)
        # a simulated device is usable, but no chip stands behind its times
        state = ("simulated" if d.simulated else "yes") if d.available else "no"
        print(
            f"{d.name:<{w}} {d.kind:<8} {state:<10} {kernels:>7}  "
            f"{d.plugin:<10} {d.reason if not d.available else d.about}"
        )
    return 0


def _cmd_claims(device: str, as_json: bool) -> int:
    """What ``device`` claims, as data, without its hardware (its plugin is enough)."""
    from anychip.core.plugin.claims import claims_of
    from anychip.core.plugin.host import get_registry
    from anychip.errors import DeviceError

    device = device.strip().lower()  # device names are case-insensitive
    registry = get_registry([device])
    if device not in registry.backends:
        raise DeviceError(f"no device {device!r} is registered (have: {sorted(registry.backends)})")
    rows = [
        {
            "domain": c.domain or "ai.onnx",
            "op": c.op,
            "since": c.since,
            "until": c.until,
            "dtypes": sorted(d.short for d in c.dtypes) if c.dtypes is not None else None,
            "constraints": [x.reason for x in c.constraints],
        }
        for c in sorted(claims_of(registry.backends[device]), key=lambda c: (c.op, c.since))
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{device} claims {len(rows)} op version ranges:")
    for r in rows:
        until = r["until"] if r["until"] is not None else "latest"
        dtypes = ",".join(r["dtypes"]) if r["dtypes"] else "any"
        print(f"  {r['domain']}::{r['op']:<24} opset {r['since']}..{until:<7} {dtypes}")
        for reason in r["constraints"]:
            print(f"      only where: {reason}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from anychip.errors import AnychipError

    if args.concurrency < 1:
        raise AnychipError(f"--concurrency must be >= 1, got {args.concurrency}")
    sess = _load(args)
    feeds = random_feeds(sess, args.seed)
    feeds.update(read_inputs(args.input or []))
    # What a user sees (issue 45): the first run, runs 2-10 (where a session's feedback
    # measures and may explore), then the steady time (the median of --repeat runs after).
    first = _timed(sess, feeds)
    early = [_timed(sess, feeds) for _ in range(EARLY_RUNS)]
    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    phases = {
        "steady_runs": len(times),
        "first_ms": first * 1e3,
        "runs_2_10_mean_ms": sum(early) / len(early) * 1e3,
        "steady_ms": float(np.median(times)) * 1e3,
    }
    every = [first, *early, *times]
    if args.concurrency != 1:  # N requests in flight over N sessions (cli/concurrency.py)
        phases["concurrent"] = concurrent_runs(
            sess, lambda: _load(args), feeds, args.concurrency, max(1, args.repeat)
        )
    if not viz_commands.run_extras(args, sess, feeds, outs, every, phases):  # --json: there
        for line in sess.placement().failures():  # a device that failed over comes first
            print(line)
        print(f"devices: {','.join(sess.devices)}")
        for info, out in zip(sess.outputs, outs):
            shape = list(np.shape(out))
            print(f"output {info.name}: {np.asarray(out).dtype}{shape} {_checksum(out)}")
        st = viz_commands.run_stats(every)
        print(
            f"time: first run {phases['first_ms']:.2f} ms, runs 2-10 mean "
            f"{phases['runs_2_10_mean_ms']:.2f} ms, steady {phases['steady_ms']:.2f} ms "
            f"(median of {len(times)} runs after run 10)"
        )
        print(
            f"after the first: p50 {st['p50_ms']:.2f} ms, p90 {st['p90_ms']:.2f} ms, p99 "
            f"{st['p99_ms']:.2f} ms, best "
            f"{st['best_ms']:.2f} ms over runs 2-{len(times) + 1 + EARLY_RUNS}; "
            f"{st['throughput_per_s']:.1f} runs/s"
        )
        if "concurrent" in phases:
            print(concurrency_text(phases["concurrent"]))
        if args.placement:
            render(sess.placement())
        if getattr(args, "memory", False) and hasattr(sess, "memory"):
            render(sess.memory())
    if args.bring_up:
        sess.close()  # checks the devices' memory is back (BringUpError otherwise)
    return 0


#: Runs 2 to 10, reported apart from the first run and the steady time.
EARLY_RUNS = 9


def _load(args: argparse.Namespace, **options: object) -> object:
    """The session ``run`` and ``partition`` share: model, devices, strict, policy."""
    import anychip

    if getattr(args, "bring_up", False):
        options["bring_up"] = True
    if getattr(args, "shape", None):
        options["free_dimension_overrides"] = free_dims(args.model, args.shape)
    return anychip.load(
        args.model,
        devices=args.devices,
        strict=args.strict,
        placement_policy=args.placement_policy,
        **options,
    )


def free_dims(model: str, shapes: list[str]) -> dict[str, int]:
    """``--shape`` values as free dimension overrides: ``name=[1,128]`` (an input's whole
    shape: each of its symbolic dimensions takes the size at its place) or ``dim=128`` (a
    symbolic dimension by name, as onnxruntime_perf_test's ``-f``)."""
    import onnx

    from anychip.errors import InputError

    inputs = {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in onnx.load(model, load_external_data=False).graph.input
    }
    out: dict[str, int] = {}
    for item in shapes:
        name, sep, value = item.partition("=")
        value = value.strip()
        try:
            sizes = json.loads(value) if sep else None
        except ValueError:
            sizes = None
        if not sep or not (isinstance(sizes, int) or isinstance(sizes, list)):
            raise InputError(f"--shape expects name=[1,128] or dim=128, got {item!r}")
        if isinstance(sizes, int):
            out[name] = sizes
            continue
        if name not in inputs:
            raise InputError(f"--shape {item!r}: the model has no input {name!r} ({list(inputs)})")
        declared = inputs[name]
        if len(sizes) != len(declared) or not all(isinstance(n, int) for n in sizes):
            raise InputError(f"--shape {item!r}: input {name!r} has shape {declared}")
        for d, n in zip(declared, sizes):
            if isinstance(d, str) and d:
                out[d] = n
            elif d and d != n:
                raise InputError(f"--shape {item!r}: dimension {d} of {name!r} is fixed")
    return out


def _cmd_partition(args: argparse.Namespace) -> int:
    from anychip.core.plan.calibration import resolve_calibration_mode

    if resolve_calibration_mode(args.calibration) == "auto":
        _calibrate_missing(args.devices)
    return viz_commands.partition(args, _load(args, calibration=args.calibration))


def _calibrate_missing(devices: str | None) -> None:
    """Measure each device of ``devices`` with no calibration here, before placing: the
    placement ``partition`` shows is then the one every later load gets (a load never waits:
    it would place a new device's model on the host and measure in the background)."""
    from anychip.core.plan.calibration import calibration_for, load_calibration
    from anychip.core.plan.devices import resolve_devices
    from anychip.core.plugin.host import get_registry

    names = resolve_devices(devices, strict=False)
    registry = get_registry(names)
    for name in names:
        backend = registry.backends[name]
        if load_calibration(backend) is None and backend.available()[0]:
            print(f"measuring {name} (once; cached, see anychip calibrate)", file=sys.stderr)
            calibration_for(backend)


def _cmd_demo(args: argparse.Namespace) -> int:
    import anychip
    from anychip.core.report.why_one_device import why_one_device
    from anychip.zoo import light_model

    # Seeded random weights: the shipped model's constant fills make every output the same.
    model = light_model(args.model, seed=0).SerializeToString()
    listed = [d for d in anychip.devices() if d.available]
    if args.devices:  # the devices named, each beside the cpu
        usable = [n.strip() for n in args.devices.split(",") if n.strip()]
        named = []
    else:  # those a session with no device list would use (auto_select)
        usable = [d.name for d in listed if d.auto_select]
        named = [d.name for d in listed if not d.auto_select]
    # One run per device: "opencl:0" and "opencl:cpu" name the device "opencl" names.
    usable = [n for n in usable if ":" not in n or n.split(":")[0] not in usable]
    named = [n for n in named if ":" not in n or n.split(":")[0] not in named]
    title = "ResNet-50" if args.model == "resnet50" else args.model
    print(
        f"anychip {anychip.__version__}: light {title} (seeded random weights) on "
        f"{', '.join(usable)}"
    )
    if named:
        print(
            f"  (also here, used when named: {', '.join(named)}; e.g. anychip demo --devices "
            f"{named[0]})"
        )
    ref, ref_name, feeds = None, "cpu", None
    for dev in ["cpu"] + [d for d in usable if d != "cpu"]:
        devices = [dev] if dev == "cpu" else [dev, "cpu"]
        # the load's warning of what fell back is the nodes= column below: not on stderr too
        with _log_level("anychip", logging.ERROR):
            sess = anychip.load(model, devices=devices)  # measured costs (calibrated, cached)
        if feeds is None:
            feeds = random_feeds(sess)
            ref, ref_name = _reference(model, feeds)
            if ref is None:
                print(
                    "  (onnxruntime is not installed: outputs are compared with anychip's cpu; "
                    "pip install 'anychip[ort]' to compare with onnxruntime)"
                )
        first = sess.placement().by_device()
        t0 = time.perf_counter()
        sess.run(None, feeds)
        t_first = time.perf_counter() - t0
        # the session's feedback runs, until it has decided (its trials take a few requests
        # each; it may re-place once)
        for _ in range(DEMO_MAX_FEEDBACK_RUNS):
            sess.run(None, feeds)
            if sess.feedback is None or sess.feedback.done:
                break
        t_steady = min(_timed(sess, feeds) for _ in range(3))
        (out,) = sess.run(None, feeds)
        if ref is None:
            ref = out
        diff = float(np.max(np.abs(out - ref)))
        rep = sess.placement()
        moved = "" if rep.by_device() == first else f" (first placed {first})"
        print(
            f"  {'+'.join(devices):<10} first run {t_first * 1e3:7.1f} ms, then "
            f"{t_steady * 1e3:7.1f} ms  max|diff vs {ref_name}|={diff:.2e}  "
            f"nodes={rep.by_device()}{moved}  copies/run={rep.copy_count}"
        )
        if rep.decision:
            print(f"  {'':<10} cost model: {rep.decision}")
        # every node on one device: why no split pays, from what placement priced
        for sentence in why_one_device(rep):
            print(f"  {'':<10} not on {sentence}")
    return 0


@contextlib.contextmanager
def _log_level(name: str, level: int) -> Iterator[None]:
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


#: The demo's bound on a session's feedback runs (each trial: a warm-up, then three to six
#: pairs, each run after the other placement's preceded by an untimed one).
DEMO_MAX_FEEDBACK_RUNS = 100


def _timed(sess: object, feeds: dict[str, np.ndarray]) -> float:
    t0 = time.perf_counter()
    sess.run(None, feeds)  # type: ignore[attr-defined]
    return time.perf_counter() - t0


def _cmd_new_backend(args: argparse.Namespace) -> int:
    from anychip.cli.scaffold import new_backend

    root = new_backend(args.name, graph_mode=args.graph_mode, out_dir=args.out)
    print(f"wrote {root}: pip install -e {root}, then pytest {root / 'tests'}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import anychip
    from anychip.core.plan.calibration import calibrate, clear_calibrations, load_calibration
    from anychip.core.plugin.host import get_registry
    from anychip.paths import cache_root

    if args.model:  # a model's placements, measured now and remembered
        from anychip.cli.calibrate_model import calibrate_model

        return calibrate_model(args)
    if args.clear:
        for dev in args.device or [None]:
            n = clear_calibrations(dev)
            print(f"removed {n} calibration(s){f' of {dev}' if dev else ''} from {cache_root()}")
        return 0
    registry = get_registry()
    usable = [d.name for d in anychip.devices() if d.available]
    for name in args.device or usable:
        if name not in usable:
            raise anychip.DeviceError(f"device {name!r} is not available here (have: {usable})")
        backend = registry.backends[name]
        cal = calibrate(backend, since=load_calibration(backend))  # one version on
        link = (
            "host memory"
            if cal.link is None
            else f"link {cal.link[0] * 1e6:.1f} us + {cal.link[1] / 1e9:.1f} GB/s"
        )
        print(f"{name}: calibration {cal.version}, measured in {cal.seconds:.2f} s; {link}")
        for cls, pts in cal.points.items():
            figures = ", ".join(f"{w:.3g} -> {t * 1e6:.1f} us" for w, t in pts)
            print(f"  {cls:<12} {figures}")
        if callable(getattr(registry.backends[name], "bring_up", None)):
            _bring_up(registry.backends[name])
    print(f"cache: {cache_root() / 'calibration'}")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    """``anychip cache info``: the folder, its limit and what each cache holds; ``clear``:
    every file removed."""
    from anychip.paths import cache_info, cache_limit, cache_root, clear_cache

    root = cache_root()
    if args.action == "clear":
        files, nbytes = clear_cache(root)
        print(f"removed {files} file(s), {nbytes / 2**20:.1f} MiB, from {root}")
        return 0
    rows = cache_info(root)
    total = sum(b for _, b in rows.values())
    data = {
        "folder": str(root),
        "limit_bytes": cache_limit(),
        "bytes": total,
        "caches": {k: {"files": f, "bytes": b} for k, (f, b) in rows.items()},
    }
    if viz_commands.emit_json(args, data):
        return 0
    print(
        f"{root}: {total / 2**20:.1f} MiB of {cache_limit() / 2**20:.0f} MiB (ANYCHIP_CACHE_LIMIT)"
    )
    for name, (files, nbytes) in rows.items():
        print(f"  {name:<14} {files:>6} file(s) {nbytes / 2**20:>9.1f} MiB")
    return 0


def _bring_up(backend: object) -> None:
    """A device with a ``bring_up(graphs)`` (IREE's) measures its claimed ops' node cases."""
    import time

    from anychip.conformance.cases import load_case, node_cases
    from anychip.core.plugin.claims import claims_of
    from anychip.ir.onnx import import_model
    from anychip.opsets.schemas import resolve

    t0 = time.perf_counter()
    graphs = []
    for case in node_cases({c.op for c in claims_of(backend)}):
        try:
            model = import_model(load_case(case)[0])
        except Exception:  # a case anychip cannot import is not the device's to measure
            continue
        for node in model.graph.walk():
            node.version = node.version or model.opset_imports.get(node.domain, 1)
            node.meta["since"] = resolve(node.op_type, node.domain, node.version).since_version
        graphs.append(model.graph)
    counts = backend.bring_up(graphs)  # type: ignore[attr-defined]
    print(
        f"  bring-up: {counts['accepted']} node signatures accepted, {counts['refused']} "
        f"refused, in {time.perf_counter() - t0:.0f} s (cached per IREE version and device)"
    )


def _reference(model: bytes, feeds: dict[str, np.ndarray]) -> tuple[object, str]:
    """onnxruntime's output when it is installed (the test extra has it), else none yet."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "cpu"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0], "onnxruntime"


class _VersionAction(argparse.Action):
    """``--version``: print ``cli/version.version_lines()`` and exit (argparse's own version
    action takes a fixed string; this one imports the plugins only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from anychip.cli.version import version_lines

        print("\n".join(version_lines()))
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per verb."""
    from anychip.cli import bench as bench_cli
    from anychip.cli import conformance as conformance_cli

    parser = argparse.ArgumentParser(
        prog="anychip",
        description="Run one ONNX model on any set of devices.",
        epilog="commands:\n" + __doc__.split("\n\n", 1)[1].rstrip() + "\n\nEach command's "
        "options: anychip COMMAND --help.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="anychip's version, its libraries' and each plugin's, then exit",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    dev = sub.add_parser("devices", help="list backends, availability and why not")
    dev.add_argument("--ops", metavar="DEVICE", help="the ops x dtypes x opsets DEVICE claims")
    viz_commands.add_json(dev, "the devices (or claims)")
    run = sub.add_parser("run", help="run a model with random or given inputs")
    part = sub.add_parser("partition", help="place a model and print the placement, not run it")
    for p in (run, part):
        p.add_argument("model")
        p.add_argument("--devices", default=None, help="comma list, e.g. npu,cpu")
        p.add_argument(
            "--strict", action="store_true", help="no fallback: an error lists what would fall back"
        )
        p.add_argument(
            "--placement-policy",
            choices=["latency", "prefer-first", "min-copies"],
            default=None,
            help="latency (the measured cost model; default), prefer-first (the first device "
            "takes every node it can), min-copies",
        )
        p.add_argument(
            "--shape",
            action="append",
            metavar="NAME=[1,128]",
            help="an input's shape for its symbolic dimensions, or DIM=128 for one symbolic "
            "dimension by name (repeatable; default: each symbolic dimension is 1)",
        )
    viz_commands.add_json(part, "the placement")
    part.add_argument(
        "--calibration",
        choices=["auto", "cached", "off"],
        default=None,
        help="measure costs (auto), use only cached measurements, or declared figures (off)",
    )
    run.add_argument(
        "--input",
        action="append",
        help="name=file.npy|file.pb (TensorProto)|file.npz, or file.npz (repeatable)",
    )
    run.add_argument(
        "--repeat", type=int, default=5, help="runs after run 10 whose median is the steady time"
    )
    run.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="then N requests in flight over N sessions (N-1 more loaded), --repeat each: "
        "throughput and latency p50/p90/p99",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--placement", action="store_true", help="print the placement report")
    run.add_argument("--memory", action="store_true", help="print memory statistics")
    run.add_argument(
        "--bring-up",
        action="store_true",
        help="no failover; every device kernel checked and compared with the CPU's, device "
        "memory checked at the end (slow: for a new device)",
    )
    viz_commands.add_arguments(sub, run, part)
    demo = sub.add_parser("demo", help="run a light model (ResNet-50) on every available device")
    demo.add_argument(
        "--model",
        default="resnet50",
        choices=LIGHT_MODELS,
        help="which of onnx's light models to run, with seeded random weights",
    )
    demo.add_argument(
        "--devices",
        default=None,
        help="devices to run beside the cpu, e.g. vulkan,ort:cpu (default: those a session "
        "with no device list uses)",
    )
    conformance_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    nb = sub.add_parser("new-backend", help="write a backend package skeleton that passes the kit")
    nb.add_argument("name")
    nb.add_argument("--graph-mode", action="store_true", help="a compile()-style backend")
    nb.add_argument("-o", "--out", default=".", help="the folder to write anychip-NAME/ in")
    cal = sub.add_parser("calibrate", help="measure each device's costs on this machine (cached)")
    cal.add_argument("--device", action="append", help="a device (repeatable); default: all")
    cal.add_argument("--clear", action="store_true", help="forget the cached measurements")
    cal.add_argument("model", nargs="?", help="a model: measure its placements over --devices")
    cal.add_argument("--devices", help="with a model: the device set, e.g. openvino:cpu,cpu")
    cache = sub.add_parser("cache", help="the cache folder: what it holds, or clear it")
    cache.add_argument("action", choices=["info", "clear"])
    viz_commands.add_json(cache, "the cache's folders")
    for p in sub.choices.values():  # -q on every command: no progress, no warnings
        if "-q" not in p._option_string_actions:
            p.add_argument("-q", "--quiet", action="store_true", help="no progress, no warnings")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anychip`` command; returns the exit status."""
    from anychip.cli import bench as bench_cli
    from anychip.cli import conformance as conformance_cli
    from anychip.core.logsetup import configure_logging
    from anychip.errors import AnychipError
    from anychip.viz.terminal import progress_bars

    args = _parser().parse_args(argv)
    handler = {
        "devices": _cmd_devices,
        "run": _cmd_run,
        "partition": _cmd_partition,
        "demo": _cmd_demo,
        "conformance": conformance_cli.command,
        "bench": bench_cli.command,
        "calibrate": _cmd_calibrate,
        "cache": _cmd_cache,
        "new-backend": _cmd_new_backend,
        "inspect": viz_commands.inspect,
    }[args.cmd]
    quiet = getattr(args, "quiet", False)
    logger = configure_logging()
    level = logger.level  # main() may run in a caller's process (tests): --quiet is per call
    try:
        if quiet:
            logger.setLevel(logging.ERROR)
        with progress_bars(enabled=not quiet and not getattr(args, "json", False)):
            return handler(args)
    except AnychipError as e:
        print(f"anychip: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"anychip: error: {e}", file=sys.stderr)
        return 2
    finally:
        logger.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
