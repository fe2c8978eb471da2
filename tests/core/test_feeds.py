"""``core/api/feeds.py``: feeds checked against the model's inputs, outputs chosen and detached."""

from __future__ import annotations

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
