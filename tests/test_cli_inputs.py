"""``anychip run --input``: .npy, .pb (an ONNX TensorProto, as test data ships) and .npz."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import numpy_helper

from anychip.cli.inputs import read_inputs
from anychip.cli.main import main
from anychip.errors import InputError
from tests.core.test_placement import three_nodes

_SUM = re.compile(r"sha1=(\w+)")


def _checksum(argv: list[str], capsys) -> str:
    assert main(argv) == 0
    return _SUM.search(capsys.readouterr().out).group(1)


def test_pb_and_npz_give_what_npy_gives(tmp_path, capsys) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(three_nodes())
    arr = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", arr)
    (tmp_path / "input_0.pb").write_bytes(numpy_helper.from_array(arr, "x").SerializeToString())
    np.savez(tmp_path / "feeds.npz", x=arr)
    run = ["run", str(model), "--devices", "cpu", "--input"]
    want = _checksum([*run, f"x={tmp_path / 'x.npy'}"], capsys)
    assert _checksum([*run, f"x={tmp_path / 'input_0.pb'}"], capsys) == want
    assert _checksum([*run, str(tmp_path / "input_0.pb")], capsys) == want  # the tensor's name
    assert _checksum([*run, f"x={tmp_path / 'feeds.npz'}"], capsys) == want
    assert _checksum([*run, str(tmp_path / "feeds.npz")], capsys) == want  # every array by key
    np.save(tmp_path / "x.npy", arr * 2)
    assert _checksum([*run, f"x={tmp_path / 'x.npy'}"], capsys) != want  # the file was read


def test_read_inputs_dtypes_and_names(tmp_path) -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    (tmp_path / "t.pb").write_bytes(numpy_helper.from_array(ids, "ids").SerializeToString())
    np.savez(tmp_path / "two.npz", a=ids, b=ids.astype(np.float16))
    got = read_inputs([str(tmp_path / "t.pb"), f"b={tmp_path / 'two.npz'}"])
    assert set(got) == {"ids", "b"}
    assert got["ids"].dtype == np.int64 and got["ids"].tolist() == ids.tolist()
    assert got["b"].dtype == np.float16


@pytest.mark.parametrize(
    "item, says",
    [
        ("x", "name=file.npy"),
        ("x={d}/missing.pb", "no file"),
        ("c={d}/two.npz", "has no array 'c'"),
        ("x={d}/junk.pb", "not a readable .pb file"),
        ("{d}/unnamed.pb", "has no name"),
    ],
)
def test_bad_inputs_are_input_errors(tmp_path, item, says) -> None:
    np.savez(tmp_path / "two.npz", a=np.zeros(2), b=np.ones(2))
    (tmp_path / "junk.pb").write_bytes(b"\xff\xff\xff not a tensor")
    unnamed = numpy_helper.from_array(np.zeros(2, np.float32))
    (tmp_path / "unnamed.pb").write_bytes(unnamed.SerializeToString())
    with pytest.raises(InputError, match=says):
        read_inputs([item.format(d=tmp_path)])
