"""ai.onnx.ml on scikit-learn models converted by skl2onnx, against onnxruntime: the native
kernels with their C loops and, with ``ANYCHIP_NATIVE=0``, their numpy paths."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from bench._wild_sklearn import sklearn_cases
from tests.wild._compare import anychip_run, assert_same, ort_run

_NAMES = (
    "LogisticRegression (binary)",
    "LinearSVC (multi)",
    "DecisionTreeClassifier (multi)",
    "GradientBoostingClassifier (binary)",
    "RandomForestRegressor (regression)",
    "ExtraTreesRegressor (regression)",
    "SVC rbf probability (multi)",
    "SVC linear (binary)",
    "NuSVC poly (multi)",
    "SVR rbf (regression)",
    "NuSVR sigmoid (regression)",
    "SimpleImputer",
    "Normalizer",
    "StandardScaler",
    "Pipeline imputer+scaler+PCA+SVC (multi)",
    "RandomForestRegressor *_as_tensor (regression)",
    "GradientBoostingClassifier *_as_tensor (multi)",
    "OneHotEncoder strings",
    "LabelEncoder strings",
    "DictVectorizer",
    "AdaBoostClassifier (multi)",
    "OrdinalEncoder strings",
)


@functools.cache
def _cases() -> dict:
    """The named cases' builders (scikit-learn imported when a test first runs, not at
    collection: 1-2 s in each pytest-xdist worker)."""
    return {name: build for name, build, _ in sklearn_cases(False) if name in _NAMES}


def test_every_named_case_exists() -> None:
    assert sorted(_cases()) == sorted(_NAMES)


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("name", _NAMES)
def test_sklearn_model_matches_onnxruntime(name, native, monkeypatch) -> None:
    monkeypatch.setenv("ANYCHIP_NATIVE", native)
    model, feeds = _cases()[name]()
    got, _ = anychip_run(model, feeds)
    assert_same(got, ort_run(model, feeds), rtol=1e-4, atol=1e-4)


def test_tree_nan_follows_missing_value_tracks_true(monkeypatch) -> None:
    from onnx import TensorProto as T
    from onnx import helper as h

    # One split on feature 1; NaN goes right (false) unless tracked to the left (true). LEQ
    # alone takes the native walk's BRANCH_LEQ-only loop, LT the general one.
    for native, track, mode in itertools.product("10", (0, 1), ("BRANCH_LT", "BRANCH_LEQ")):
        monkeypatch.setenv("ANYCHIP_NATIVE", native)
        node = h.make_node(
            "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
            nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[1, 0, 0],
            nodes_values=[0.5, 0, 0], nodes_modes=[mode, "LEAF", "LEAF"],
            nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
            nodes_missing_value_tracks_true=[track, 0, 0],
            target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
            target_weights=[-1.0, 1.0], n_targets=1,
        )  # fmt: skip
        g = h.make_graph(
            [node], "g", [h.make_tensor_value_info("x", T.FLOAT, [None, 2])],
            [h.make_tensor_value_info("y", T.FLOAT, [None, 1])],
        )  # fmt: skip
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 3)])
        x = np.array([[0, 0.2], [0, 0.9], [0, np.nan]], np.float32)
        got, _ = anychip_run(m, {"x": x})
        assert_same(got, ort_run(m, {"x": x}))
        assert got[0][2, 0] == (-1.0 if track else 1.0)


def _label_encoder(ver: int, attrs: dict, xt: int, yt: int):
    from onnx import helper as h

    node = h.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    g = h.make_graph(
        [node], "g", [h.make_tensor_value_info("x", xt, [None])],
        [h.make_tensor_value_info("y", yt, [None])],
    )  # fmt: skip
    return h.make_model(
        g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", ver)]
    )


def _label_encoder_cases() -> list:
    from onnx import TensorProto as T
    from onnx import numpy_helper as nh

    words = np.array(["a", "b", "zz", "c"], dtype=object)
    abc = ["a", "b", "c"]
    tensor = nh.from_array(np.array([1.5, 2.5, 3.5], np.float32))
    return [
        (1, {"classes_strings": abc}, T.STRING, T.INT64, words),
        (2, {"keys_strings": abc, "values_int64s": [1, 2, 3], "default_int64": -7}, T.STRING, T.INT64, words),  # noqa: E501
        (2, {"keys_strings": abc, "values_strings": ["x", "y", "z"], "default_string": "?"}, T.STRING, T.STRING, words),  # noqa: E501
        (4, {"keys_tensor": nh.from_array(np.array(abc, dtype=object)), "values_tensor": tensor}, T.STRING, T.FLOAT, words),  # noqa: E501
        (4, {"keys_int64s": [1, 2, 3], "values_strings": ["x", "y", "z"]}, T.INT64, T.STRING, np.array([1, 2, 5])),  # noqa: E501
        (4, {"keys_floats": [1.0, float("nan")], "values_floats": [5.0, 7.0]}, T.FLOAT, T.FLOAT, np.array([1, np.nan, 3], np.float32)),  # noqa: E501
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(6))
def test_label_encoder_strings_and_tensors(case) -> None:
    # Opset 1 (classes_strings) failed through the reference evaluator's newer class.
    ver, attrs, xt, yt, x = _label_encoder_cases()[case]
    model = _label_encoder(ver, attrs, xt, yt)
    got, _ = anychip_run(model, {"x": x})
    assert_same(got, ort_run(model, {"x": x}))


def test_threaded_tree_walk_is_bit_identical(monkeypatch) -> None:
    # 1100 rows x 20 trees crosses the threading threshold; rows split over threads in
    # blocks, each row's sum in tree order: the same bits for any thread count.
    from sklearn.datasets import make_regression
    from sklearn.ensemble import RandomForestRegressor

    from anychip.backends.cpu.kernels import op_ml_tree_ensemble as te
    from bench._wild_sklearn import convert

    x, y = make_regression(1300, 8, random_state=1)
    x = x.astype(np.float32)
    est = RandomForestRegressor(n_estimators=20, random_state=0).fit(x[:200], y[:200])
    model, feeds = convert(est, x[:1]), {"X": x[200:]}
    assert len(x[200:]) * 20 >= te._THREAD_WALKS
    outs = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("ANYCHIP_NATIVE_THREADS", threads)
        outs.append(anychip_run(model, feeds)[0][0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    assert_same([outs[0]], ort_run(model, feeds), rtol=1e-4, atol=1e-4)
