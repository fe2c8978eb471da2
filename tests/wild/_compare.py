"""Helpers of the tests of models from the wild: run a model on onnxruntime and on anychip."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import anychip

__all__ = ["ort_run", "anychip_run", "assert_same"]


def ort_run(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    """onnxruntime's CPU provider on ``model``, with its graph optimizations off (the
    reference is the model as written, not onnxruntime's fused rewrite)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def anychip_run(model: onnx.ModelProto, feeds: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """anychip on the CPU; also returns the warnings the load issued."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = anychip.load(model, devices=["cpu"])
    return sess.run(None, feeds), [str(w.message) for w in caught]


def assert_same(got: list[Any], want: list[Any], rtol: float = 1e-5, atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, list):  # a sequence of maps (ZipMap)
            assert isinstance(g, list) and len(g) == len(w)
            for gm, wm in zip(g, w):
                assert list(gm) == list(wm)
                np.testing.assert_allclose(list(gm.values()), list(wm.values()), rtol, atol)
            continue
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind in "OUS" or w.dtype == bool:
            assert g.tolist() == w.tolist()
        elif w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
