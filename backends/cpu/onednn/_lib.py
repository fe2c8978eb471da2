"""Loading oneDNN (``libdnnl.so.3``) through cffi's ABI mode: no headers, no compiler.

The library comes from the ``onednn-cpu-gomp`` wheel (the ``onednn`` extra), which puts it in
``<sys.prefix>/lib``; ``ANYCHIP_ONEDNN_LIB`` names another copy. ``ANYCHIP_ONEDNN=0`` hides it
(the numpy kernels then run everywhere). The declarations below are the few v3 C API functions
the kernels use, with the signatures of ``oneapi/dnnl/dnnl.h``; enums are passed as ``int`` (and the
data handle of ``dnnl_memory_set_data_handle`` as ``uintptr_t``, the same register on the
64-bit ABIs, so numpy's address goes in without a cast) and
their values (``C``) were generated once with gcc from the 3.2 headers (they are the same in
3.13, so a newer ``libdnnl.so.3`` loads too).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys
import threading
from pathlib import Path
from typing import Any

from anychip.backends.cpu.native import omp, pool
from anychip.codegen.ffi import declare
from anychip.errors import KernelError

__all__ = [
    "C",
    "Lib",
    "MATMUL_SMALL_WORK",
    "SMALL_WORK",
    "available",
    "check",
    "findable",
    "get",
    "omp_threads",
    "reset",
    "unavailable_reason",
]

_CDEF = """
typedef struct dnnl_engine *dnnl_engine_t;
typedef struct dnnl_stream *dnnl_stream_t;
typedef struct dnnl_memory_desc *dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc *const_dnnl_memory_desc_t;
typedef struct dnnl_memory *dnnl_memory_t;
typedef struct dnnl_primitive_desc *dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_desc *const_dnnl_primitive_desc_t;
typedef struct dnnl_primitive *dnnl_primitive_t;
typedef const struct dnnl_primitive *const_dnnl_primitive_t;
typedef struct dnnl_primitive_attr *dnnl_primitive_attr_t;
typedef const struct dnnl_primitive_attr *const_dnnl_primitive_attr_t;
typedef struct dnnl_post_ops *dnnl_post_ops_t;
typedef const struct dnnl_post_ops *const_dnnl_post_ops_t;
typedef int64_t dnnl_dims_t[12];
typedef struct { int arg; dnnl_memory_t memory; } dnnl_exec_arg_t;
typedef struct {
    int major; int minor; int patch; const char *hash; unsigned cpu_runtime; unsigned gpu_runtime;
} dnnl_version_t;

const dnnl_version_t *dnnl_version(void);
int dnnl_engine_create(dnnl_engine_t *engine, int kind, size_t index);
int dnnl_stream_create(dnnl_stream_t *stream, dnnl_engine_t engine, unsigned flags);
int dnnl_stream_wait(dnnl_stream_t stream);
int dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t *memory_desc, int ndims,
    const dnnl_dims_t dims, int data_type, int tag);
int dnnl_memory_desc_create_with_strides(dnnl_memory_desc_t *memory_desc, int ndims,
    const dnnl_dims_t dims, int data_type, const dnnl_dims_t strides);
int dnnl_memory_desc_destroy(dnnl_memory_desc_t memory_desc);
int dnnl_memory_desc_equal(const_dnnl_memory_desc_t lhs, const_dnnl_memory_desc_t rhs);
size_t dnnl_memory_desc_get_size(const_dnnl_memory_desc_t memory_desc);
int dnnl_memory_desc_clone(dnnl_memory_desc_t *memory_desc,
    const_dnnl_memory_desc_t existing_memory_desc);
int dnnl_memory_create(dnnl_memory_t *memory, const_dnnl_memory_desc_t memory_desc,
    dnnl_engine_t engine, void *handle);
int dnnl_memory_destroy(dnnl_memory_t memory);
int dnnl_memory_set_data_handle(dnnl_memory_t memory, uintptr_t handle);
int dnnl_convolution_forward_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, int prop_kind, int alg_kind, const_dnnl_memory_desc_t src_desc,
    const_dnnl_memory_desc_t weights_desc, const_dnnl_memory_desc_t bias_desc,
    const_dnnl_memory_desc_t dst_desc, const dnnl_dims_t strides, const dnnl_dims_t dilates,
    const dnnl_dims_t padding_l, const dnnl_dims_t padding_r, const_dnnl_primitive_attr_t attr);
int dnnl_pooling_forward_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, int prop_kind, int alg_kind, const_dnnl_memory_desc_t src_desc,
    const_dnnl_memory_desc_t dst_desc, const dnnl_dims_t strides, const dnnl_dims_t kernel,
    const dnnl_dims_t dilation, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const_dnnl_primitive_attr_t attr);
int dnnl_lstm_forward_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, int prop_kind, int direction,
    const_dnnl_memory_desc_t src_layer_desc, const_dnnl_memory_desc_t src_iter_desc,
    const_dnnl_memory_desc_t src_iter_c_desc, const_dnnl_memory_desc_t weights_layer_desc,
    const_dnnl_memory_desc_t weights_iter_desc, const_dnnl_memory_desc_t weights_peephole_desc,
    const_dnnl_memory_desc_t weights_projection_desc, const_dnnl_memory_desc_t bias_desc,
    const_dnnl_memory_desc_t dst_layer_desc, const_dnnl_memory_desc_t dst_iter_desc,
    const_dnnl_memory_desc_t dst_iter_c_desc, unsigned flags, const_dnnl_primitive_attr_t attr);
int dnnl_gru_forward_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, int prop_kind, int direction,
    const_dnnl_memory_desc_t src_layer_desc, const_dnnl_memory_desc_t src_iter_desc,
    const_dnnl_memory_desc_t weights_layer_desc, const_dnnl_memory_desc_t weights_iter_desc,
    const_dnnl_memory_desc_t bias_desc, const_dnnl_memory_desc_t dst_layer_desc,
    const_dnnl_memory_desc_t dst_iter_desc, unsigned flags, const_dnnl_primitive_attr_t attr);
int dnnl_lbr_gru_forward_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, int prop_kind, int direction,
    const_dnnl_memory_desc_t src_layer_desc, const_dnnl_memory_desc_t src_iter_desc,
    const_dnnl_memory_desc_t weights_layer_desc, const_dnnl_memory_desc_t weights_iter_desc,
    const_dnnl_memory_desc_t bias_desc, const_dnnl_memory_desc_t dst_layer_desc,
    const_dnnl_memory_desc_t dst_iter_desc, unsigned flags, const_dnnl_primitive_attr_t attr);
int dnnl_vanilla_rnn_forward_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, int prop_kind, int activation, int direction,
    const_dnnl_memory_desc_t src_layer_desc, const_dnnl_memory_desc_t src_iter_desc,
    const_dnnl_memory_desc_t weights_layer_desc, const_dnnl_memory_desc_t weights_iter_desc,
    const_dnnl_memory_desc_t bias_desc, const_dnnl_memory_desc_t dst_layer_desc,
    const_dnnl_memory_desc_t dst_iter_desc, unsigned flags, float alpha, float beta,
    const_dnnl_primitive_attr_t attr);
int dnnl_matmul_primitive_desc_create(dnnl_primitive_desc_t *primitive_desc,
    dnnl_engine_t engine, const_dnnl_memory_desc_t src_desc,
    const_dnnl_memory_desc_t weights_desc, const_dnnl_memory_desc_t bias_desc,
    const_dnnl_memory_desc_t dst_desc, const_dnnl_primitive_attr_t attr);
int dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t *reorder_primitive_desc,
    const_dnnl_memory_desc_t src_desc, dnnl_engine_t src_engine,
    const_dnnl_memory_desc_t dst_desc, dnnl_engine_t dst_engine,
    const_dnnl_primitive_attr_t attr);
const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(const_dnnl_primitive_desc_t primitive_desc,
    int what, int index);
int dnnl_primitive_desc_query(const_dnnl_primitive_desc_t primitive_desc, int what, int index,
    void *result);
int dnnl_primitive_desc_destroy(dnnl_primitive_desc_t primitive_desc);
int dnnl_primitive_create(dnnl_primitive_t *primitive, const_dnnl_primitive_desc_t primitive_desc);
int dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
    const dnnl_exec_arg_t *args);
int dnnl_primitive_destroy(dnnl_primitive_t primitive);
int dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr);
int dnnl_primitive_attr_destroy(dnnl_primitive_attr_t attr);
int dnnl_primitive_attr_set_scratchpad_mode(dnnl_primitive_attr_t attr, int mode);
int dnnl_primitive_attr_get_scratchpad_mode(const_dnnl_primitive_attr_t attr, int *mode);
int dnnl_primitive_desc_get_attr(const_dnnl_primitive_desc_t primitive_desc,
    const_dnnl_primitive_attr_t *attr);
int dnnl_primitive_attr_set_post_ops(dnnl_primitive_attr_t attr, const_dnnl_post_ops_t post_ops);
int dnnl_primitive_attr_set_fpmath_mode(dnnl_primitive_attr_t attr, int mode);
int dnnl_post_ops_create(dnnl_post_ops_t *post_ops);
int dnnl_post_ops_destroy(dnnl_post_ops_t post_ops);
int dnnl_post_ops_append_eltwise(dnnl_post_ops_t post_ops, int alg_kind, float alpha,
    float beta);
int dnnl_post_ops_append_sum(dnnl_post_ops_t post_ops, float scale, int32_t zero_point,
    int data_type);
int dnnl_post_ops_append_binary(dnnl_post_ops_t post_ops, int alg_kind,
    const_dnnl_memory_desc_t src1_desc);
"""


class C:
    """The enum values and argument indices used (from oneDNN 3.2's headers)."""

    cpu = 1
    stream_default = 1
    f32, s32, s8, u8 = 3, 4, 5, 6
    any = 1
    a, ab, abc, abcd, abcde, abcdef = 2, 3, 4, 5, 6, 7
    tnc, ldnc, ldigo, ldgo = 4, 5, 6, 5
    forward_inference = 96
    convolution_direct = 1
    pooling_max = 511
    pooling_avg_include_padding = 767
    pooling_avg_exclude_padding = 1023
    eltwise_relu = 32
    eltwise_tanh = 33
    eltwise_hardsigmoid = 40
    eltwise_logistic = 41
    eltwise_clip = 46
    binary_add = 0x1FFF0
    left2right, right2left, bidirectional_concat = 1, 2, 3
    query_impl_info_str = 8
    query_src_md = 129
    query_weights_md = 131
    query_dst_md = 133
    query_scratchpad_md = 136
    scratchpad_mode_user = 1
    arg_src, arg_src_1, arg_src_2 = 1, 2, 3
    arg_dst, arg_dst_1, arg_dst_2 = 17, 18, 19
    arg_weights, arg_weights_1 = 33, 34
    arg_bias = 41
    arg_workspace = 64
    arg_scratchpad = 80
    #: DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1: the second input of post-op ``i``.
    arg_post_op_src1 = staticmethod(lambda i: 32768 * (i + 1) | 2)


class Lib:
    """The loaded library: ``ffi``, ``dnnl`` (the cffi handle), one CPU engine and stream."""

    def __init__(self, ffi: Any, dnnl: Any, path: str) -> None:
        self.ffi = ffi
        self.dnnl = dnnl
        self.path = path
        engine = ffi.new("dnnl_engine_t *")
        check(dnnl.dnnl_engine_create(engine, C.cpu, 0), "creating the CPU engine")
        self.engine = engine[0]
        stream = ffi.new("dnnl_stream_t *")
        check(dnnl.dnnl_stream_create(stream, self.engine, C.stream_default), "creating a stream")
        self.stream = stream[0]
        v = dnnl.dnnl_version()
        self.version = f"{v.major}.{v.minor}.{v.patch}"


def check(status: int, what: str) -> None:
    """Raise a ``KernelError`` naming ``what`` failed when a oneDNN call returns non-zero."""
    if status != 0:
        raise KernelError(f"oneDNN: {what} failed with status {status}")


def _candidates() -> list[Path]:
    env = os.environ.get("ANYCHIP_ONEDNN_LIB")
    if env:
        return [Path(env)]
    # pip puts the wheel's data files under the install scheme's "data" prefix: the venv or
    # interpreter prefix, or the user base for ``pip install --user``.
    prefixes = dict.fromkeys(
        [sys.prefix, sys.base_prefix, site.getuserbase(), "/usr/local", "/usr"]
    )
    return [Path(p) / "lib" / "libdnnl.so.3" for p in prefixes]


_state: dict[str, Any] = {}
_lock = threading.Lock()


def _load() -> None:
    if _hidden():
        _state.update(lib=None, reason="hidden by ANYCHIP_ONEDNN=0")
        return
    if _state.get("loaded") is not None:  # shown again after reset(): the same instance
        _state.update(lib=_state["loaded"], reason="")
        return
    if importlib.util.find_spec("cffi") is None:  # pragma: no cover - a core dependency
        _state.update(lib=None, reason="cffi is not installed")
        return
    # libgomp reads this once, when it loads (with libdnnl, if nothing loaded it before):
    # see backends/cpu/native/omp.py. ``OMP_WAIT_POLICY=ACTIVE`` in the environment keeps the
    # spinning.
    omp.passive_wait()
    errors = []
    for path in _candidates():
        if not path.exists():
            errors.append(f"{path}: not found")
            continue
        ffi = declare(_CDEF)
        try:
            lib = Lib(ffi, ffi.dlopen(str(path)), str(path))
            _state.update(lib=lib, loaded=lib, reason="")
            return
        except (OSError, KernelError) as e:
            errors.append(f"{path}: {e}")
    _state.update(
        lib=None,
        reason="libdnnl.so.3 not loadable (install the onednn extra: "
        f"pip install 'anychip[onednn]'); tried {'; '.join(errors)}",
    )


def _hidden() -> bool:
    return os.environ.get("ANYCHIP_ONEDNN", "1").strip().lower() in ("0", "false", "no", "off")


def findable() -> bool:
    """Whether a library file is there and not hidden (cheap: no loading; the file search is
    made once per ``ANYCHIP_ONEDNN_LIB`` value, as every CPU partition's load asks)."""
    return not _hidden() and _found_file(os.environ.get("ANYCHIP_ONEDNN_LIB"))


@functools.lru_cache(maxsize=4)
def _found_file(env_lib: str | None) -> bool:
    return any(p.exists() for p in _candidates())


def get() -> Lib | None:
    """The loaded library, or None (``unavailable_reason()`` says why). Loaded once."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _load()
    return _state["lib"]


def available() -> bool:
    """Whether oneDNN is loaded and enabled."""
    return get() is not None


def unavailable_reason() -> str:
    """Why oneDNN is not in use ('' when it is)."""
    get()
    return _state["reason"]


def reset() -> None:
    """Make the next ``get()`` read ``ANYCHIP_ONEDNN`` again (tests, benchmarks). A library
    already loaded stays loaded (its cached primitives belong to it) and is used again."""
    with _lock:
        _state.pop("lib", None)
        _state.pop("reason", None)


#: Work (multiply-adds, or elements for pooling) under which a primitive runs on one OpenMP
#: thread: waking the team's sleeping threads (``OMP_WAIT_POLICY=PASSIVE``) for each small
#: primitive cost more than the second thread gave (2 threads against 1, wall, medians: LSTM
#: T=100 1.46 / 0.75 ms, ShuffleNet-like 9.1 / 4.1, SqueezeNet 11.3 / 9.8).
SMALL_WORK = 1 << 24
#: The same for a MatMul: in idle seconds (``bench/onednn_team.py --kind matmul``, medians of
#: 30, team of 1 / 2) 128x256x256 (2^23) ran 194-224 / 167-207 us, 128x256x1024 646-676 /
#: 407-461; at load average 2 the 2^23 case 181 / 190.
MATMUL_SMALL_WORK = 1 << 23


def omp_threads() -> int:
    """The OpenMP team size oneDNN will use (``omp_get_max_threads`` of the system libgomp)."""
    return omp.max_threads()


class team_for:
    """Inside: one OpenMP thread when ``work`` is under ``small`` (``SMALL_WORK`` by default;
    primitives made and run there are keyed by that team size, ``omp_threads()``), else the
    team as it is. Yields the threads given (the team size on entry): a primitive left on one
    thread may split its work over them. A class, not a generator (entered around every
    convolution, pool and product): its small-work path is three OpenMP calls and about 1.3
    us warm, most of it the calls (``omp.set_threads`` 0.3 us each)."""

    __slots__ = ("work", "small", "n", "paused")

    def __init__(self, work: float, small: float | None = None) -> None:
        self.work, self.small = work, small
        self.n = 0
        self.paused: Any = None

    def __enter__(self) -> int:
        n = self.n = omp.max_threads()
        if n <= 1:
            return n
        if self.work >= (SMALL_WORK if self.small is None else self.small):
            self.paused = pool.paused()  # the team takes every core: the pool's threads sleep
            self.paused.__enter__()
            return n
        omp.set_threads(1)
        return n

    def __exit__(self, *exc: Any) -> None:
        if self.n <= 1:
            return
        if self.paused is not None:
            paused, self.paused = self.paused, None
            paused.__exit__(*exc)
            return
        omp.set_threads(self.n)
