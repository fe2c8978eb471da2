"""Memory inside sessions: plans and their bound, the report, pools from plugins, planned
arenas (the out protocol), budget-aware placement, out-of-memory recovery, dynamic re-plans."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

import anychip
from anychip import hookimpl
from anychip.core.memory import MemoryPool, NumpyAllocator, check_plan, lifetimes
from anychip.core.plugin import host as plugins
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.kernels import KernelTable
from anychip.core.report.memory import MemoryReport
from anychip.core.run import memory as memory_partition
from anychip.core.run.memory import plan_program
from anychip.errors import AnychipError, OutOfMemoryError
from tests.backends.npu_stub.conftest import convnet
from tests.models import transformer_layer


@pytest.fixture(autouse=True)
def _usual_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests watch the pool serve each run's planned arena: the usual runs, not a
    replay's private buffers (``cpu/replay/record.py``, tested in tests/core/test_replay.py)."""
    monkeypatch.setenv("ANYCHIP_REPLAY", "0")


@pytest.fixture(autouse=True)
def _every_arena_used(monkeypatch):
    """These tests exercise the arena on small models: every planned arena is used (below
    ``MIN_ARENA_BYTES`` a session lets numpy allocate; tests/wild/test_sklearn_fixed_costs)."""
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)


LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx")))
DOMAIN = "test.memory"


# -- plans of real models ------------------------------------------------------------------------


#: Their weights (240-550 MB, folded from constant fills at load) cost 0.4-1.1 s CPU each and
#: their plans are plain chains: the slow tier plans them; the other six are the branchy ones.
_BIG = {"bvlc_alexnet", "vgg19", "zfnet512"}


def _name(path: str) -> str:
    return os.path.basename(path)[len("light_") : -len(".onnx")]


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if _name(p) in _BIG else p for p in LIGHT_MODELS]
    + ["transformer"],
    ids=lambda p: _name(p) or p,
)
def test_planned_peak_within_bound(path):
    model = transformer_layer() if path == "transformer" else path
    sess = anychip.load(model, devices=["cpu"])
    rec = sess.memory()["cpu"]
    print(f"{os.path.basename(path)}: planned {rec.planned} lower bound {rec.lower_bound}")
    assert rec.lower_bound > 0
    assert rec.lower_bound <= rec.planned <= 1.15 * rec.lower_bound
    # The check the planner ran, again from the outside on the compiled program.
    (pm,) = sess.compiled.part_memory.values()
    pp = plan_program(pm.program, pm.current.shapes)
    assert pp.plan.total_size == rec.planned


def test_report_prints_a_table_and_peak_is_measured():
    sess = anychip.load(transformer_layer(), devices=["cpu"])
    assert sess.memory()["cpu"].peak == 0  # nothing ran yet
    x = np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)
    sess.run(None, {"x": x})
    report = sess.memory()
    assert isinstance(report, MemoryReport) and len(report) == 1
    rec = report["cpu"]
    # Live at once at least one [1, 64, 1024] feed-forward activation (and its GELU, unless
    # the CPU's fusion computes the GELU in place over it: backends/cpu/passes).
    assert rec.peak >= 64 * 1024 * 4
    text = str(report)
    assert text.splitlines()[0].split()[:4] == ["device", "parts", "planned", "arena"]
    assert "cpu" in text and "static" in text


def test_cli_run_memory_prints_the_report(capsys):
    from anychip.cli.main import main

    assert main(["run", os.path.join(LIGHT, "light_squeezenet.onnx"), "--repeat", "1",
                 "--memory", "--devices", "cpu"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "lower bound" in out and "\ncpu " in out


# -- a plugin: out-protocol kernels, a counting pool ---------------------------------------------


class CountingPool(MemoryPool):
    """A plain pool that counts its calls (the plugin's replacement for the CPU pool)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.allocs: list[int] = []
        self.frees = 0

    def alloc(self, nbytes):
        block = super().alloc(nbytes)
        self.allocs.append(nbytes)
        return block

    def free(self, block):
        self.frees += 1
        super().free(block)


class MemoryPlugin:
    ANYCHIP_API_VERSION = 1

    def __init__(self, replace_pool: bool = True) -> None:
        self.replace_pool = replace_pool
        self.pools: list[CountingPool] = []
        self.outs: list[np.ndarray | None] = []
        self.boom = False
        table = KernelTable("cpu")

        @table.register("Scale2", domain=DOMAIN)
        def scale2(x, *, out=None):
            self.outs.append(out)
            if out is not None and out.shape == x.shape and out.dtype == x.dtype:
                return np.multiply(x, 2, out=out)
            return x * 2

        @table.register("Peek", domain=DOMAIN)
        def peek(x):
            return x[...]  # a view of its input, which the planner is not told about

        @table.register("Boom", domain=DOMAIN)
        def boom(x):
            if self.boom:
                raise MemoryError("simulated allocation failure")
            return x + 1

        self.table = table

    @hookimpl
    def anychip_register_ops(self, registry):
        for op in ("Scale2", "Peek", "Boom"):
            registry.add_schema(
                onnx.defs.OpSchema(
                    op,
                    DOMAIN,
                    1,
                    inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
                    outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
                    type_constraints=[("T", ["tensor(float)"], "")],
                )
            )

    @hookimpl
    def anychip_register_kernels(self, registry):
        registry.add_kernels(self.table)

    @hookimpl
    def anychip_register_memory_pools(self, registry):
        if not self.replace_pool:
            return

        def factory(backend):
            pool = CountingPool(backend.name, allocator=NumpyAllocator())
            self.pools.append(pool)
            return pool

        registry.add_pool("cpu", factory)


@pytest.fixture(params=[True], ids=["counting_pool"])
def plugin(request):
    p = MemoryPlugin(replace_pool=request.param)
    plugins.register_plugin(p, "test_memory_plugin")
    yield p
    plugins.unregister_plugin("test_memory_plugin")


kernels_only = pytest.mark.parametrize("plugin", [False], ids=["default_pool"], indirect=True)


def _model(nodes, shape=(4, 8), out_shape=None) -> onnx.ModelProto:
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape or shape))],
    )
    return h.make_model(
        g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(DOMAIN, 1)], ir_version=8
    )


def _op(op, ins, outs, name, domain=DOMAIN):
    return h.make_node(op, ins, outs, name=name, domain=domain)


def _chain_model() -> onnx.ModelProto:
    """x -> Scale2 -> Relu -> Scale2 -> Scale2 -> Flatten(view) -> y."""
    return _model(
        [
            _op("Scale2", ["x"], ["a"], "s1"),
            _op("Relu", ["a"], ["b"], "relu", domain=""),
            _op("Scale2", ["b"], ["c"], "s2"),
            _op("Scale2", ["c"], ["d"], "s3"),
            h.make_node("Flatten", ["d"], ["y"], name="flat", axis=1),
        ]
    )


def _expected_chain(x):
    return (np.maximum(x * 2, 0) * 4).reshape(x.shape[0], -1)


def test_plugin_pool_serves_the_planned_arena(plugin):
    sess = anychip.load(_chain_model(), devices=["cpu"])
    (pool,) = plugin.pools
    rng = np.random.default_rng(0)
    results = []
    for _ in range(4):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        results.append((x, y))
    # Every run with a plan took one block and gave it back.
    planned_runs = len(pool.allocs)
    assert planned_runs >= 3 and pool.frees == planned_runs
    assert pool.stats().alloc_count == planned_runs and pool.stats().in_use == 0
    # Kernels wrote into the pool's memory: their out views are views of its blocks.
    given = [o for o in plugin.outs if o is not None]
    assert len(given) >= 2 * planned_runs
    # Outputs handed out are never overwritten by later runs (y views the arena: copied out).
    for x, y in results:
        np.testing.assert_allclose(y, _expected_chain(x), rtol=1e-6)
    rec = sess.memory()["cpu"]
    # A plain pool gives each block back at once: nothing stays reserved; its peak is one arena.
    assert rec.reserved == pool.stats().reserved == 0
    assert pool.stats().peak == pool.allocs[-1] > 0
    assert rec.planned >= pool.allocs[-1] and rec.peak >= pool.allocs[-1]


@kernels_only
def test_outputs_do_not_alias_the_reused_arena(plugin):
    sess = anychip.load(_chain_model(), devices=["cpu"])
    xs = [np.full((4, 8), v, np.float32) for v in (1, 2, 3, 4)]
    ys = [sess.run(None, {"x": x})[0] for x in xs]
    assert sess.compiled.pools["cpu"].stats().alloc_count == 3  # one block, cached and reused
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, _expected_chain(x))
    assert not np.shares_memory(ys[-1], ys[-2])


@kernels_only
def test_unexpected_view_of_the_arena_is_copied(plugin):
    # a = 2x; p = view of a; c = 2p may reuse a's bytes once a is dead; then y = p + c.
    model = _model(
        [
            _op("Scale2", ["x"], ["a"], "s1"),
            _op("Peek", ["a"], ["p"], "peek"),
            _op("Scale2", ["p"], ["c"], "s2"),
            _op("Scale2", ["c"], ["e"], "s3"),
            h.make_node("Add", ["p", "e"], ["y"], name="add"),
        ]
    )
    sess = anychip.load(model, devices=["cpu"])
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], 2 * x + 8 * x)
    assert not plugin.pools  # the default pool: a CachingPool keeps the arena's block
    rec = sess.memory()["cpu"]
    pool = sess.compiled.pools["cpu"]
    assert rec.reserved == pool.stats().reserved > 0
    assert pool.stats().alloc_count == 2  # runs 2 and 3; run 1 planned the shapes
    assert [o is not None for o in plugin.outs[-3:]] == [True, True, True]


def test_dynamic_shapes_plan_per_signature_and_replan(plugin):
    sess = anychip.load(_model(
        [_op("Scale2", ["x"], ["a"], "s1"), _op("Scale2", ["a"], ["b"], "s2"),
         h.make_node("Relu", ["b"], ["y"], name="relu")],
        shape=("n", 8),
    ), devices=["cpu"], plan_cache_size=1)  # fmt: skip
    rng = np.random.default_rng(1)

    def run(n):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(4 * x, 0), rtol=1e-6)

    run(2)
    rec = sess.memory()["cpu"]
    assert (rec.dynamic_partitions, rec.hits, rec.misses, rec.replans) == (1, 0, 1, 0)
    small = rec.planned
    assert small >= 2 * 8 * 4
    run(2)
    run(2)
    rec = sess.memory()["cpu"]
    assert (rec.hits, rec.misses, rec.replans) == (2, 1, 0)
    run(16)  # a new signature evicts the first (cache of one)
    rec = sess.memory()["cpu"]
    assert (rec.hits, rec.misses, rec.replans) == (2, 2, 0)
    assert rec.planned > small
    run(2)  # planned before, evicted since: a re-plan
    rec = sess.memory()["cpu"]
    assert (rec.hits, rec.misses, rec.replans) == (2, 3, 1)
    assert "2/3/1" in str(sess.memory())


def test_out_of_memory_in_the_pool_leaves_the_session_usable(plugin):
    sess = anychip.load(_chain_model(), devices=["cpu"])
    (pool,) = plugin.pools
    x = np.ones((4, 8), np.float32)
    sess.run(None, {"x": x})  # first run: plans where shapes are not static yet
    sess.run(None, {"x": x})
    assert pool.allocs
    pool.capacity = 64  # smaller than the arena
    with pytest.raises(OutOfMemoryError) as info:
        sess.run(None, {"x": x})
    e = info.value
    assert e.device == "cpu" and e.capacity == 64 and e.need > 64
    assert "cpu" in str(e) and str(e.need) in str(e)
    pool.capacity = None
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected_chain(x))
    assert pool.stats().in_use == 0


def test_memory_error_in_a_kernel_becomes_out_of_memory(plugin):
    sess = anychip.load(
        _model([_op("Boom", ["x"], ["a"], "boom"), h.make_node("Relu", ["a"], ["y"], name="r")]),
        devices=["cpu"],
    )
    x = np.ones((4, 8), np.float32)
    plugin.boom = True
    with pytest.raises(OutOfMemoryError, match="node 'boom'.*out of memory") as info:
        sess.run(None, {"x": x})
    assert isinstance(info.value, AnychipError) and info.value.device == "cpu"
    # A custom op's output shape is unknown before it runs: need 0 ("unknown"); the capacity
    # is the host's memory.
    assert (
        info.value.need == 0
        and info.value.capacity == sess.compiled.backends[0].device.memory_capacity
    )
    plugin.boom = False
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + 1)


def test_failed_run_releases_device_tensors(plugin):
    from anychip.backends.xpu_stub.driver import get_driver

    # r lives on the XPU while Boom runs on the CPU; the failure must give r back.
    model = _model(
        [
            h.make_node("Relu", ["x"], ["r"], name="relu"),
            _op("Boom", ["r"], ["b"], "boom"),
            h.make_node("Add", ["r", "b"], ["y"], name="add"),
        ]
    )
    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False)
    assert [p.device for p in sess.partitions] == ["xpu", "cpu", "xpu"]
    driver = get_driver()
    x = np.full((4, 8), -1.0, np.float32)
    x[0] = 3
    sess.run(None, {"x": x})
    before = driver.mem_info().used
    plugin.boom = True
    with pytest.raises(OutOfMemoryError):
        sess.run(None, {"x": x})
    assert driver.mem_info().used == before
    plugin.boom = False
    r = np.maximum(x, 0)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], r + r + 1)
    rec = sess.memory()["xpu"]
    assert rec.partitions == 2 and rec.peak > 0


# -- budget-aware placement ----------------------------------------------------------------------


def test_npu_too_small_falls_back_and_the_report_says_why():
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    model = convnet()
    sess = anychip.load(
        model, devices=["npu", "cpu"], cost_model=False, device_options={"npu": {"memory": 4096}}
    )
    assert all(p.device == "cpu" for p in sess.partitions)
    report = sess.memory()
    assert report["npu"].partitions == 0
    (note,) = report.notes
    assert note.startswith("npu: partition 0 needs") and "out of memory" in note
    assert "note: npu" in str(report)
    want = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5)
    # With room it stays on the NPU, and the NPU's plan is reported.
    big = anychip.load(model, devices=["npu", "cpu"], cost_model=False)
    big.run(None, {"x": x})
    rec = big.memory()["npu"]
    assert rec.partitions == 1 and rec.lower_bound <= rec.planned and rec.reserved > 0
    assert rec.peak > 0 and not big.memory().notes


class _TinyTensor:
    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.nbytes = data.nbytes


class TinyChip(Backend):
    """A kernel-mode device with 2 KiB of memory."""

    name = "tiny"
    kind = "tiny"
    priority = 5

    def device_model(self) -> DeviceModel:
        return DeviceModel("tiny", "tiny", memory_capacity=2048)

    def _copy_in(self, array):
        return _TinyTensor(array.copy())

    def _copy_out(self, tensor):
        return tensor.data.copy()


class TinyPlugin:
    ANYCHIP_API_VERSION = 1

    @hookimpl
    def anychip_register_backends(self, registry):
        registry.add_backend(TinyChip())

    @hookimpl
    def anychip_register_kernels(self, registry):
        table = KernelTable("tiny")

        @table.register(["Relu", "Neg"])
        def unary(x):
            return _TinyTensor(np.maximum(x.data, 0))

        registry.add_kernels(table)


@pytest.fixture
def tiny():
    plugins.register_plugin(TinyPlugin(), "test_tiny_chip")
    yield
    plugins.unregister_plugin("test_tiny_chip")


def _relu_chain(n: int) -> onnx.ModelProto:
    nodes = [h.make_node("Relu", ["x"], ["a"], name="r1"), h.make_node("Relu", ["a"], ["y"],
             name="r2")]  # fmt: skip
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_kernel_mode_device_too_small_moves_work_elsewhere(tiny):
    x = np.linspace(-1, 1, 256, dtype=np.float32)[None]
    small = anychip.load(_relu_chain(64), devices=["tiny", "cpu"], cost_model=False)
    assert [p.device for p in small.partitions] == ["tiny"]
    assert small.memory()["tiny"].planned == 256
    big = anychip.load(_relu_chain(256), devices=["tiny", "cpu"], cost_model=False)
    assert [p.device for p in big.partitions] == ["cpu"]
    (note,) = big.memory().notes
    assert "tiny" in note and "needs 3072 bytes" in note and "has 2048" in note
    reasons = {n.reason for n in big.placement().nodes}
    assert any("out of memory" in r for r in reasons)
    np.testing.assert_array_equal(big.run(None, {"x": x})[0], np.maximum(x, 0))
    with pytest.raises(OutOfMemoryError, match="tiny: partition 0 needs 3072") as info:
        anychip.load(_relu_chain(256), devices=["tiny"], strict=True, cost_model=False)
    assert (info.value.need, info.value.capacity, info.value.device) == (3072, 2048, "tiny")


# -- the planner's checker on a whole program ----------------------------------------------------


def test_every_program_plan_passes_the_checker():
    sess = anychip.load(transformer_layer(), devices=["cpu"])
    (pm,) = sess.compiled.part_memory.values()
    pp, prog = pm.current, pm.program
    # Lifetimes rebuilt from the program's own steps. A view's slot (a Reshape's, a Split's)
    # reads its input: the plan counts its reads as reads of the viewed tensor; they are
    # dropped here, which only shortens lifetimes, so the plan must still pass. This layer
    # has none left: its heads' Reshapes, Transposes and the packed projection's parts are
    # inside HeadsAttention (passes/fuse_heads.py).
    alias = prog.alias_slots
    assert not alias
    steps = [
        (
            tuple(r for r in st.reads if r not in alias),
            tuple(w for w in st.writes if w not in alias),
        )
        for st in prog.memory_steps()
    ]
    sizes = {s: int(np.prod(sh)) * dt.itemsize for s, (sh, dt) in pp.shapes.items()}
    tensors = lifetimes(steps, sizes, inputs=prog.external_slots() | alias,
                        outputs=set(prog.output_slots))  # fmt: skip
    assert {t.id for t in tensors} == set(pp.plan.offsets)
    check_plan(pp.plan, tensors)
    # A plan moved onto a tensor live at the same time is refused.
    a, b = next(
        (a, b)
        for a in tensors
        for b in tensors
        if a.id != b.id
        and a.first_use_step <= b.last_use_step
        and b.first_use_step <= a.last_use_step
        and pp.plan.inplace.get(a.id) != b.id
        and pp.plan.inplace.get(b.id) != a.id
    )
    pp.plan.offsets[a.id] = pp.plan.offsets[b.id]
    with pytest.raises(AnychipError, match="live together and overlap"):
        check_plan(pp.plan, tensors)
