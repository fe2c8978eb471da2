"""Memory descriptors, cached primitives and the weight cache (not kernels).

A ``Prim`` is one oneDNN primitive made for one (op, shapes, layouts, attributes, threads) key
and kept: creating a convolution costs about 1 ms, executing a small one a few microseconds.
Its memory objects are made once with no buffer; each run points them at the numpy arrays.
Weights are reordered into the layout the primitive chose (format ``any``) once per weight
array and kept in ``WEIGHTS``, keyed by the array's identity plus a sample of its values.

Every primitive is made with a user scratchpad (``make_pd``), which its ``Prim`` owns
(``Prim.scratch``, bound once) unless the caller passes one: oneDNN's own (library mode) is a
buffer per thread, kept in thread-local storage of the thread that made the primitive and
looked up in the thread that runs it, so a primitive cached on one thread and run on another
(a session on a worker thread, a CPU reference in a new thread) wrote its temporaries to that
thread's buffer: NULL (SIGSEGV in im2col) or one sized for other primitives (decision 057).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.onednn import _math
from anychip.backends.cpu.onednn._lib import C, Lib, check, get
from anychip.backends.cpu.replay import record as _replay
from anychip.core.memory import hugepages
from anychip.errors import KernelError

__all__ = [
    "Prim",
    "attr",
    "sampled",
    "REORDERS",
    "Unsupported",
    "cached",
    "channels_last",
    "channels_last_tag",
    "dims",
    "empty_for",
    "from_channels_last",
    "impl_info",
    "layouts",
    "make_pd",
    "md",
    "md_equal",
    "plain_tag",
    "post_ops",
    "ptr",
    "query_md",
    "reorder_into",
    "reorder_tags",
    "scratchpad_arg",
    "scratchpad_mode",
    "user_scratchpad",
    "weights",
]

#: Tags of plain row-major and channels-last layouts by rank.
_PLAIN = {1: C.a, 2: C.ab, 3: C.abc, 4: C.abcd, 5: C.abcde, 6: C.abcdef}
_CHANNELS_LAST = {3: 15, 4: 22, 5: 33}  # acb, acdb, acdeb


class Unsupported(Exception):
    """oneDNN declined these attributes (primitive descriptor creation failed): the caller
    runs the numpy kernel instead."""


def lib() -> Lib:
    found = get()
    assert found is not None, "oneDNN kernels called while oneDNN is unavailable"
    return found


def dims(values: Sequence[int]) -> Any:
    """A ``dnnl_dims_t`` holding ``values``."""
    return lib().ffi.new("dnnl_dims_t", [int(v) for v in values])


def md(shape: Sequence[int], tag: int, data_type: int = C.f32) -> Any:
    """A memory descriptor of ``shape`` in layout ``tag`` (``C.any``: the primitive's), of
    ``data_type`` (``C.f32`` unless given: ``C.s8``, ``C.u8``, ``C.s32``)."""
    L = lib()
    out = L.ffi.new("dnnl_memory_desc_t *")
    check(
        L.dnnl.dnnl_memory_desc_create_with_tag(out, len(shape), dims(shape), data_type, tag),
        f"describing memory {list(shape)}",
    )
    return L.ffi.gc(out[0], L.dnnl.dnnl_memory_desc_destroy)


def md_strided(shape: Sequence[int], strides: Sequence[int]) -> Any:
    """An f32 memory descriptor of ``shape`` with element ``strides``."""
    L = lib()
    out = L.ffi.new("dnnl_memory_desc_t *")
    check(
        L.dnnl.dnnl_memory_desc_create_with_strides(
            out, len(shape), dims(shape), C.f32, dims(strides)
        ),
        f"describing memory {list(shape)} with strides {list(strides)}",
    )
    return L.ffi.gc(out[0], L.dnnl.dnnl_memory_desc_destroy)


def query_md(pd: Any, what: int, index: int = 0) -> Any:
    """The memory descriptor ``what`` (``C.query_*_md``) a primitive descriptor chose (owned by
    ``pd``: keep ``pd`` alive while using it)."""
    return lib().dnnl.dnnl_primitive_desc_query_md(pd, what, index)


def md_equal(a: Any, b: Any) -> bool:
    """Whether two memory descriptors describe the same layout."""
    return bool(lib().dnnl.dnnl_memory_desc_equal(a, b))


def md_size(d: Any) -> int:
    return int(lib().dnnl.dnnl_memory_desc_get_size(d))


def channels_last(shape: Sequence[int]) -> tuple[int, ...]:
    """The (N, *spatial, C) storage shape of a logical (N, C, *spatial) tensor."""
    return (shape[0],) + tuple(shape[2:]) + (shape[1],)


def from_channels_last(buf: np.ndarray) -> np.ndarray:
    """The logical (N, C, *spatial) view of a channels-last buffer (no copy)."""
    nd = buf.ndim
    return buf.transpose((0, nd - 1) + tuple(range(1, nd - 1)))


def layouts(x: np.ndarray) -> list[int]:
    """The oneDNN tags that describe ``x``'s memory as it is (plain and/or channels-last)."""
    tags = []
    if x.flags.c_contiguous:
        tags.append(_PLAIN[x.ndim])
    if x.ndim in _CHANNELS_LAST and from_channels_last_ok(x):
        tags.append(_CHANNELS_LAST[x.ndim])
    return tags


def from_channels_last_ok(x: np.ndarray) -> bool:
    nd = x.ndim
    return x.transpose((0,) + tuple(range(2, nd)) + (1,)).flags.c_contiguous


def plain_tag(ndim: int) -> int:
    """The row-major tag of rank ``ndim`` (``abcd`` for 4)."""
    return _PLAIN[ndim]


def channels_last_tag(ndim: int) -> int:
    """The channels-last tag of rank ``ndim`` (``acdb``, NHWC, for 4)."""
    return _CHANNELS_LAST[ndim]


def ptr(a: np.ndarray) -> int:
    """The address of ``a``'s first element."""
    return a.__array_interface__["data"][0]


def pin(a: Any) -> Any:
    """A C-contiguous array as a cffi pointer made once (it holds the array), for a buffer a
    remembered path passes to ``Prim.run`` on every call (weights, bias): taking its address
    again cost about 0.6 us a call. Anything else is returned as it is."""
    if type(a) is np.ndarray and a.flags.c_contiguous:
        return lib().ffi.from_buffer(a)
    return a


class Prim:
    """A primitive with one memory object per argument; ``run`` binds arrays and executes."""

    __slots__ = (
        "pd", "prim", "mems", "mem_addrs", "args", "lock", "info", "lib", "bound", "scratch",
        "__weakref__",
    )  # fmt: skip

    def __init__(self, pd: Any, arg_mds: dict[int, Any]) -> None:
        L = self.lib = lib()
        ffi, dn = L.ffi, L.dnnl
        self.pd = pd
        if scratchpad_mode(pd) != C.scratchpad_mode_user:  # a descriptor not from make_pd
            raise KernelError(f"oneDNN: {impl_info(pd)} was made with the library scratchpad")
        out = ffi.new("dnnl_primitive_t *")
        check(dn.dnnl_primitive_create(out, pd), "creating a primitive")
        self.prim = ffi.gc(out[0], dn.dnnl_primitive_destroy)
        #: The primitive's own scratchpad (``make_pd`` asked for it as an argument), bound
        #: once; None where it needs none or the caller passes it (``scratchpad_arg``).
        self.scratch: np.ndarray | None = None
        pad = query_md(pd, C.query_scratchpad_md)
        if C.arg_scratchpad not in arg_mds and pad != ffi.NULL and md_size(pad) > 0:
            self.scratch = empty_for(pad)
            arg_mds = {**arg_mds, C.arg_scratchpad: pad}
        self.mems: dict[int, Any] = {}
        self.args = ffi.new("dnnl_exec_arg_t[]", len(arg_mds))
        for i, (arg, d) in enumerate(arg_mds.items()):
            mem = ffi.new("dnnl_memory_t *")
            check(dn.dnnl_memory_create(mem, d, L.engine, ffi.NULL), "creating a memory object")
            self.mems[arg] = ffi.gc(mem[0], dn.dnnl_memory_destroy)
            self.args[i].arg = arg
            self.args[i].memory = self.mems[arg]
        if self.scratch is not None:  # no run binds it: pointed at its buffer for good
            check(
                dn.dnnl_memory_set_data_handle(self.mems[C.arg_scratchpad], ptr(self.scratch)),
                "binding the scratchpad",
            )
        #: The memory objects' addresses, for C helpers that bind them (``_parallel.py``).
        self.mem_addrs = {arg: int(ffi.cast("uintptr_t", m)) for arg, m in self.mems.items()}
        self.lock = threading.Lock()
        _LIVE.add(self)  # its lock released in a forked child (_after_fork_in_child)
        self.info = impl_info(pd)
        #: (the one-call runner or None, its most buffers), made on the first run.
        self.bound: tuple[Any, int] | None = None

    def run(self, buffers: dict[int, np.ndarray | int]) -> None:
        """Execute with argument ``k`` in ``buffers[k]`` (arrays laid out as described, their
        addresses, or ``pin``'s pointers): in one C call where the helper builds
        (``_parallel.bound_runner``), else binding each buffer from Python."""
        bound = self.bound
        if bound is None:
            from anychip.backends.cpu.onednn._parallel import BOUND_ARGS, bound_runner

            bound = self.bound = (bound_runner(self), BOUND_ARGS)
        if bound[0] is not None and len(buffers) <= bound[1]:
            bound[0](buffers)  # under the lock, errors raised (``_parallel.Bound``)
            if _replay.ACTIVE:  # the arrays behind addresses the note holds as ints
                _replay.hold(buffers)
            return
        self._bind_and_run(buffers)
        if _replay.ACTIVE:
            _replay.note(self._bind_and_run, (buffers,))

    def _bind_and_run(self, buffers: dict[int, np.ndarray | int]) -> None:
        """``run`` binding each buffer from Python."""
        L = self.lib
        dn, mems, buf, cast = L.dnnl, self.mems, L.ffi.from_buffer, L.ffi.cast
        with self.lock:
            for arg, a in buffers.items():
                if type(a) is np.ndarray:  # through cffi's view of a dense array: half ptr()'s
                    a = cast("uintptr_t", buf(a)) if a.flags.c_contiguous else ptr(a)
                elif type(a) is not int:  # pin()'s pointer
                    a = cast("uintptr_t", a)
                dn.dnnl_memory_set_data_handle(mems[arg], a)
            check(
                dn.dnnl_primitive_execute(self.prim, L.stream, len(self.mems), self.args),
                "executing " + self.info,
            )
            dn.dnnl_stream_wait(L.stream)


def post_ops(sum_z: bool, act: tuple[int, float, float] | None, add: Any = None) -> Any:
    """A primitive attribute with, in this order, a ``sum`` post-op (the residual Z, added
    into dst before the primitive writes it), a ``binary_add`` of a tensor described by
    ``add`` (its argument is ``C.arg_post_op_src1(int(sum_z))``) and an ``eltwise`` (the
    activation); NULL for none."""
    L = lib()
    ffi, dn = L.ffi, L.dnnl
    if not sum_z and act is None and add is None:
        return attr()
    ops = ffi.new("dnnl_post_ops_t *")
    dn.dnnl_post_ops_create(ops)
    ops_h = ffi.gc(ops[0], dn.dnnl_post_ops_destroy)
    if sum_z:
        dn.dnnl_post_ops_append_sum(ops_h, 1.0, 0, 0)  # data_type undef: dst's
    if add is not None:
        check(dn.dnnl_post_ops_append_binary(ops_h, C.binary_add, add), "adding a post-op")
    if act is not None:
        dn.dnnl_post_ops_append_eltwise(ops_h, act[0], act[1], act[2])
    made = _new_attr()
    dn.dnnl_primitive_attr_set_post_ops(made, ops_h)
    return made


def _new_attr() -> Any:
    """A new primitive attribute carrying the calling thread's math mode (``_math``)."""
    L = lib()
    a = L.ffi.new("dnnl_primitive_attr_t *")
    L.dnnl.dnnl_primitive_attr_create(a)
    made = L.ffi.gc(a[0], L.dnnl.dnnl_primitive_attr_destroy)
    if _math.current() != _math.STRICT:
        check(
            L.dnnl.dnnl_primitive_attr_set_fpmath_mode(made, _math.fpmath_value()),
            "setting the fpmath mode",
        )
    return made


def attr() -> Any:
    """The attribute of a primitive with no post-op: NULL in float32 math, else one that
    carries the calling thread's math mode."""
    return lib().ffi.NULL if _math.current() == _math.STRICT else _new_attr()


def user_scratchpad(attr: Any = None) -> Any:
    """``attr`` (a new primitive attribute where None or NULL, as ``post_ops`` gives for
    none) asking for the scratchpad as an argument (``C.arg_scratchpad``, described by
    ``query_md(pd, C.query_scratchpad_md)``): oneDNN's own is kept per thread and grown when
    a primitive is made, so a primitive run on another thread needs its own. ``make_pd``
    asks it of every primitive; ``Prim`` owns the buffer unless given ``scratchpad_arg``'s."""
    L = lib()
    made = _new_attr() if attr is None or attr == L.ffi.NULL else attr
    check(
        L.dnnl.dnnl_primitive_attr_set_scratchpad_mode(made, C.scratchpad_mode_user),
        "setting the scratchpad mode",
    )
    return made


def scratchpad_arg(pd: Any, args: dict[int, Any]) -> np.ndarray:
    """Add the scratchpad to ``args`` (a primitive made with ``user_scratchpad()``) and return
    a buffer for it, to pass as ``C.arg_scratchpad`` on every run."""
    args[C.arg_scratchpad] = query_md(pd, C.query_scratchpad_md)
    return empty_for(args[C.arg_scratchpad])


def scratchpad_mode(pd: Any) -> int:
    """The scratchpad mode primitive descriptor ``pd`` was made with (``C.scratchpad_mode_user``
    or 0, oneDNN's own)."""
    L = lib()
    a = L.ffi.new("const_dnnl_primitive_attr_t *")
    mode = L.ffi.new("int *")
    check(L.dnnl.dnnl_primitive_desc_get_attr(pd, a), "querying a primitive's attribute")
    check(L.dnnl.dnnl_primitive_attr_get_scratchpad_mode(a[0], mode), "querying its scratchpad")
    return int(mode[0])


def impl_info(pd: Any) -> str:
    """The implementation oneDNN chose for primitive descriptor ``pd`` (``brg:avx512_core``,
    ``ref:any``, ...)."""
    L = lib()
    info = L.ffi.new("const char **")
    L.dnnl.dnnl_primitive_desc_query(pd, C.query_impl_info_str, 0, info)
    return L.ffi.string(info[0]).decode() if info[0] != L.ffi.NULL else "?"


def make_pd(create: Callable[..., int], *args: Any) -> Any:
    """A primitive descriptor from ``create(&pd, ...)``; ``Unsupported`` when oneDNN declines.

    ``args`` end with the primitive attribute (every ``dnnl_*_primitive_desc_create`` takes it
    last), NULL for the defaults; it is made to ask for a user scratchpad (``user_scratchpad``,
    a new attribute in place of NULL), which ``Prim`` provides: never oneDNN's per-thread one
    (see the module docstring)."""
    L = lib()
    attr = args[-1] if args else None
    if attr is None or (attr != L.ffi.NULL and L.ffi.typeof(attr) is not _attr_type(L)):
        raise TypeError(
            f"make_pd: the last argument must be a primitive attribute or NULL: {attr!r}"
        )
    if attr == L.ffi.NULL:  # not _new_attr(): NULL asked for no fpmath mode either
        a = L.ffi.new("dnnl_primitive_attr_t *")
        check(L.dnnl.dnnl_primitive_attr_create(a), "creating a primitive attribute")
        attr = L.ffi.gc(a[0], L.dnnl.dnnl_primitive_attr_destroy)
    args = (*args[:-1], user_scratchpad(attr))
    out = L.ffi.new("dnnl_primitive_desc_t *")
    status = create(out, *args)
    if status != 0:
        raise Unsupported(f"status {status}")
    return L.ffi.gc(out[0], L.dnnl.dnnl_primitive_desc_destroy)


def _attr_type(L: Lib) -> Any:
    return L.ffi.typeof("dnnl_primitive_attr_t")


_MAX_PRIMS = 1024
_PRIMS: OrderedDict[Hashable, Prim | Unsupported] = OrderedDict()
_PRIMS_LOCK = threading.Lock()
#: Every primitive alive (cached here or held by a kernel's memo), for the fork handler.
_LIVE: weakref.WeakSet[Prim] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child's primitive locks are released: one another thread held while executing
    at the fork stayed held in the child, and the next session there using that primitive
    waited forever (issue 47; ``core/run/forks.py``). A ``threading.Lock`` may be released by
    any thread, and the same objects stay (``_parallel.Bound`` holds them)."""
    for lock in [_PRIMS_LOCK, *(p.lock for p in list(_LIVE))]:
        if lock.locked():
            lock.release()


os.register_at_fork(after_in_child=_after_fork_in_child)


def cached(key: Hashable, build: Callable[[], Prim]) -> Prim:
    """The primitive for ``key`` in the calling thread's math mode, built on first use (a
    failed build is remembered too)."""
    key = (key, _math.current())
    hit = _PRIMS.get(key)
    if hit is None:
        try:
            hit = build()
        except Unsupported as e:
            hit = e
        with _PRIMS_LOCK:
            _PRIMS[key] = hit
            while len(_PRIMS) > _MAX_PRIMS:
                _PRIMS.popitem(last=False)
    if isinstance(hit, Unsupported):
        raise hit
    return hit


def reorder_prim(src: Any, dst: Any) -> Prim:
    L = lib()
    pd = make_pd(
        L.dnnl.dnnl_reorder_primitive_desc_create, src, L.engine, dst, L.engine, L.ffi.NULL
    )
    return Prim(pd, {C.arg_src: src, C.arg_dst: dst})


#: Reorders run, by what was reordered ("src", "dst", "z", "w", "wl", "wi"): tests check that a
#: chain of oneDNN nodes passes channels-last tensors without them.
REORDERS: Counter[str] = Counter()


def reorder_into(key: Hashable, src: np.ndarray, src_md: Any, dst: np.ndarray, dst_md: Any) -> None:
    """Copy ``src`` (described by ``src_md``) into ``dst`` in layout ``dst_md``."""
    _reorder(key, src, dst, lambda: reorder_prim(src_md, dst_md))


def reorder_tags(
    key: Hashable, shape: tuple[int, ...], src: np.ndarray, src_tag: int, dst: np.ndarray,
    dst_tag: int,
) -> None:  # fmt: skip
    """``reorder_into`` from layout ``src_tag`` to ``dst_tag`` of ``shape``, the descriptors
    made only when the reorder is built (about 3 us each, on every call otherwise)."""
    _reorder(key, src, dst, lambda: reorder_prim(md(shape, src_tag), md(shape, dst_tag)))


def _reorder(key: Hashable, src: np.ndarray, dst: np.ndarray, build: Callable[[], Prim]) -> None:
    p = cached(("reorder", key), build)
    REORDERS[key[1] if isinstance(key, tuple) and len(key) > 1 else "other"] += 1
    p.run({C.arg_src: src, C.arg_dst: dst})


def scratch_for(d: Any) -> np.ndarray:
    """``empty_for``'s buffer for a call's own use (``cpu/replay/record.py``'s while recorded)."""
    return _replay.empty((max(1, md_size(d) // 4),))


def empty_for(d: Any) -> np.ndarray:
    """A float32 buffer big enough for memory descriptor ``d`` (64-byte aligned by numpy's
    allocator in practice; oneDNN does not require alignment)."""
    n = max(1, md_size(d) // 4)
    return hugepages.empty(4 * n).view(np.float32)  # weights a run reads: on huge pages


_MAX_WEIGHTS = 512
WEIGHTS: OrderedDict[Hashable, tuple[tuple, bytes, np.ndarray]] = OrderedDict()


def sampled(w: np.ndarray) -> bytes:
    """65 values of ``w`` spread over it, as bytes: what ``weights`` compares to see an array
    rewritten in place."""
    return w.ravel()[:: -max(1, w.size // 64)].tobytes()  # from the last value back: 0.6 us


def weights(
    key: Hashable,
    arrays: tuple[np.ndarray | None, ...],
    prepare: Callable[[], np.ndarray],
) -> np.ndarray:
    """``prepare()`` (weights reordered for one primitive), computed once per weight arrays.

    The entry holds the arrays themselves, so their ``id`` is not reused while cached, and 65
    sampled values of each: an array replaced by another, or changed in place at a sampled
    position, is prepared again. (An in-place change that leaves every sampled value alone is
    not seen; weights are initializers, which anychip never writes.)
    """
    full = (key, _math.current()) + tuple(
        (id(a), ptr(a), a.shape) if a is not None else None for a in arrays
    )
    sample = b"|".join(sampled(a) if a is not None else b"" for a in arrays)
    hit = WEIGHTS.get(full)
    if hit is not None and all(h is a for h, a in zip(hit[0], arrays)) and hit[1] == sample:
        return hit[2]
    out = prepare()
    with _PRIMS_LOCK:
        WEIGHTS[full] = (arrays, sample, out)
        while len(WEIGHTS) > _MAX_WEIGHTS:
            WEIGHTS.popitem(last=False)
    return out
