"""``core/api/feeds.py``: feeds checked against the model's inputs, outputs chosen and detached."""

from __future__ import annotations

import types

import numpy as np
import pytest

from anychip.core.api.feeds import Feeds, check_feed, detach
from anychip.errors import InputError
from anychip.ir.dtypes import DType
from anychip.ir.value import Value


def _feeds() -> Feeds:
    x = Value("x", DType.FLOAT, ["n", 3])
    w = Value("w", DType.FLOAT, [3])
    w.const = np.random.default_rng(0).standard_normal(3).astype(np.float32)  # a default
    y = Value("y", DType.FLOAT, ["n", 3])
    return Feeds([x, w], [y])


def test_defaults_fill_what_is_not_fed_and_a_feed_overrides_them() -> None:
    f = _feeds()
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    got_x, got_w = f.check({"x": x})
    assert got_x is x and got_w.shape == (3,)
    w = np.ones(3, np.float32)
    assert f.check({"x": x, "w": w})[1] is w


@pytest.mark.parametrize(
    ("feeds", "match"),
    [
        ({}, "missing input 'x'"),
        ({"x": np.zeros((2, 3), np.float32), "z": 1}, "unknown input 'z'"),
        ({"x": np.zeros((2, 3), np.float64)}, "expects dtype float32.*astype"),
        ({"x": np.zeros((2, 3, 1), np.float32)}, "expects rank 2"),
        ({"x": np.zeros((2, 4), np.float32)}, "dimension 1 is 4, expected 3"),
        ({"x": "text"}, "expects a numpy array"),
    ],
)
def test_bad_feeds_name_the_input_and_the_fix(feeds, match) -> None:
    with pytest.raises(InputError, match=match):
        _feeds().check(feeds)


def test_python_scalars_and_lists_become_arrays_of_the_declared_dtype() -> None:
    v = Value("s", DType.FLOAT, [2])
    got = check_feed(v, [1.5, 2.5])
    assert got.dtype == np.float32 and got.tolist() == [1.5, 2.5]


def test_output_selection() -> None:
    f = _feeds()
    assert f.select(None) == [0] and f.select(["y"]) == [0]
    with pytest.raises(InputError, match="not the string 'y'; write \\['y'\\]"):
        f.select("y")
    with pytest.raises(InputError, match="unknown output 'q'"):
        f.select(["q"])


def test_detach_copies_views_and_feeds_only() -> None:
    feed = np.arange(4, dtype=np.float32)
    assert detach(feed, {"x": feed}) is not feed
    view = feed[1:]
    assert detach(view, {}).flags.owndata
    own = np.ones(2)
    assert detach(own, {"x": feed}) is own


def _static_feeds() -> Feeds:
    x = Value("x", DType.FLOAT, [2, 3])
    z = Value("z", DType.INT64, ["n"])
    return Feeds([x, z], [Value("y", DType.FLOAT, [2, 3])])


@pytest.mark.parametrize(
    ("feeds", "match"),
    [
        # as many feeds as inputs: the one-pass check must still find each of these
        ({"x": np.zeros((2, 3), np.float32), "X": np.zeros(4, np.int64)}, "unknown input 'X'"),
        ({"x": np.zeros((2, 3), np.float64), "z": np.zeros(4, np.int64)}, "expects dtype"),
        ({"x": np.zeros((3, 2), np.float32), "z": np.zeros(4, np.int64)}, "dimension 0 is 3"),
        ({"x": np.zeros((2, 3), np.float32), "z": np.zeros((4, 1), np.int64)}, "rank 1"),
        ({"x": np.zeros((2, 3), np.float32), "z": [1.5]}, "expects dtype int64"),
    ],
)
def test_the_one_pass_check_refuses_what_the_full_check_does(feeds, match) -> None:
    with pytest.raises(InputError, match=match):
        _static_feeds().check(feeds)


def test_the_one_pass_check_returns_the_feeds_themselves_in_input_order() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    z = rng.integers(0, 9, 5)
    got = _static_feeds().check({"z": z, "x": x})
    assert got[0] is x and got[1] is z
    assert _static_feeds().check({"z": [1, 2], "x": x})[1].dtype == np.int64  # full path


def test_the_one_pass_takes_dicts_of_numpy_arrays_only() -> None:
    """``quick`` answers for a dict of arrays as declared; ``Session.run`` sends anything
    else (a ``DeviceValue``, a device array, a mapping) to the modules that check them."""
    x, z = np.zeros((2, 3), np.float32), np.zeros(4, np.int64)
    f = _static_feeds()
    assert f.quick({"x": x, "z": z}) == [x, z]
    assert f.quick({"x": x, "z": [1]}) is None
    assert f.quick(types.MappingProxyType({"x": x, "z": z})) is None
    assert f.quick({"x": x}) is None
    assert f.check(types.MappingProxyType({"x": x, "z": z}))[0] is x
