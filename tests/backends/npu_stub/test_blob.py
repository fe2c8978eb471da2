"""The NPU's compiled bytes (``blob.py``): a loaded program computes the same bits without
compiling, and bytes that are not exactly what the compiler wrote are refused, never run.
(Every kernel test round-trips its executable too: ``conftest.run_on_npu``.)"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from anychip.backends.npu_stub import blob, compiler
from anychip.backends.npu_stub.backend import NpuBackend
from anychip.core.plugin.host import get_registry
from anychip.errors import DeviceError
from anychip.ir.passes import PassManager
from tests.backends.npu_stub.conftest import convnet, ir_graph

X = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)


def _compiled(precision: str = "fp32") -> tuple[NpuBackend, object]:
    npu = NpuBackend().configure(memory=16 << 20, precision=precision)
    graph = ir_graph(convnet())
    PassManager([e.pass_ for e in get_registry().passes_for("npu")], max_iterations=1)(graph)
    return npu, npu.compile(graph)


def _run(npu: NpuBackend, compiled: object) -> np.ndarray:
    (out,) = compiled.run([npu.to_device(X)])
    return npu.to_host(out)


def _resealed(data: bytes, edit) -> bytes:
    """``data`` with its manifest changed by ``edit`` and the digest made right again: what
    only the structural checks can catch."""
    head = len(blob.MAGIC) + blob._HEAD.size + 32
    _, mlen, blen = blob._HEAD.unpack_from(data, len(blob.MAGIC))
    manifest = json.loads(data[head : head + mlen])
    edit(manifest)
    text = json.dumps(manifest).encode("ascii")
    body = data[head + mlen :]
    digest = hashlib.sha256(text + body).digest()
    return blob.MAGIC + blob._HEAD.pack(blob.FORMAT, len(text), blen) + digest + text + body


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_loading_runs_the_same_bits_without_compiling(precision):
    npu, compiled = _compiled(precision)
    data = compiled.serialize()
    before = dict(compiler.STATS)
    fresh = NpuBackend().configure(memory=16 << 20, precision=precision)  # another device
    loaded = fresh.load_compiled(data)
    assert compiler.STATS["compiles"] == before["compiles"]
    assert compiler.STATS["loads"] == before["loads"] + 1
    np.testing.assert_array_equal(_run(fresh, loaded), _run(npu, compiled))
    assert loaded.info == compiled.info
    assert loaded.serialize() == data  # the same program, written again


def test_the_weights_are_stored_packed_as_the_device_holds_them():
    npu, compiled = _compiled()
    data = compiled.serialize()
    program, image, _ = blob.load(data, "fp32")
    assert len(image) == program.weights_bytes == compiled.info["weights_bytes"]
    assert len(data) < program.weights_bytes + 64 * 1024  # the weights once, plus the manifest


def test_another_precision_is_refused():
    _, compiled = _compiled("fp16")
    with pytest.raises(DeviceError, match="precision 'fp16'"):
        NpuBackend().configure(memory=16 << 20).load_compiled(compiled.serialize())


@pytest.mark.parametrize("damage", ["flip_weight", "flip_manifest", "truncate", "pad", "foreign"])
def test_damaged_bytes_are_refused(damage):
    _, compiled = _compiled()
    data = bytearray(compiled.serialize())
    if damage == "flip_weight":
        data[-100] ^= 0x01  # one bit of a weight: the digest differs
    elif damage == "flip_manifest":
        data[len(blob.MAGIC) + blob._HEAD.size + 40] ^= 0x20
    elif damage == "truncate":
        del data[len(data) // 2 :]
    elif damage == "pad":
        data += b"\0"
    else:
        data = bytearray(b"ANYCHIPC" + bytes(200))
    with pytest.raises(DeviceError, match="npu: "):
        NpuBackend().configure(memory=16 << 20).load_compiled(bytes(data))


def _overlap(m: dict) -> None:
    offsets = m["plan"]["offsets"]
    for entry in offsets:
        entry[1] = 0  # every intermediate at offset 0: tensors live together would overlap


def _weights(m: dict) -> None:
    op = next(op for op in m["ops"] if op["weights"])
    op["weights"] = op["weights"][:-1]  # its builder asks for one more than it is given


def _slot(m: dict) -> None:
    m["ops"][-1]["slots_out"] = [m["ops"][0]["slots_out"][0]]  # written twice, other shape


def _dtype(m: dict) -> None:
    m["slots"][0][0] = "object"


def _op(m: dict) -> None:
    m["ops"][0]["op"] = "Cos"


@pytest.mark.parametrize("edit", [_overlap, _weights, _slot, _dtype, _op])
def test_a_consistent_digest_over_an_inconsistent_program_is_refused(edit):
    _, compiled = _compiled()
    data = _resealed(compiled.serialize(), edit)
    with pytest.raises(DeviceError, match="npu: "):
        NpuBackend().configure(memory=16 << 20).load_compiled(data)


def test_a_refused_load_leaves_no_device_memory_taken():
    npu, compiled = _compiled()
    data = _resealed(compiled.serialize(), _overlap)
    fresh = NpuBackend().configure(memory=16 << 20)
    with pytest.raises(DeviceError):
        fresh.load_compiled(data)
    assert fresh.memory_stats().in_use == 0
