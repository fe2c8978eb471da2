"""scikit-learn models converted by skl2onnx for the wild corpus (see wild_corpus.py).

Each estimator is fitted on a seeded synthetic data set and converted with ai.onnx.ml opset 3
(ai.onnx 17); the feeds are held-out rows. Two tree models are rewritten with the
``*_as_tensor`` attributes LightGBM's exporter writes (``as_tensor``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx

__all__ = ["sklearn_cases", "convert", "as_tensor"]

_OPSETS = {"": 17, "ai.onnx.ml": 3}


def convert(estimator: Any, x: Any, **options: Any) -> onnx.ModelProto:
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(estimator, x, target_opset=_OPSETS, **options)


def _data(kind: str, rows: int, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification, make_regression

    if kind == "regression":
        x, y = make_regression(rows + 200, 12, n_informative=6, noise=0.1, random_state=0)
    else:
        classes = 2 if kind == "binary" else 3
        x, y = make_classification(
            rows + 200, 12, n_informative=6, n_classes=classes, random_state=0
        )
    return x.astype(dtype), y


def _estimators(full: bool) -> list[tuple[str, str, Callable[[], Any]]]:
    from sklearn import (
        decomposition,
        ensemble,
        linear_model,
        naive_bayes,
        neighbors,
        neural_network,
        pipeline,
        preprocessing,
        svm,
        tree,
    )
    from sklearn.impute import SimpleImputer

    n = 100 if full else 20
    lm, ens, pre, make = linear_model, ensemble, preprocessing, pipeline.make_pipeline
    seed = {"random_state": 0}
    trees = {"n_estimators": n, "random_state": 0}
    mlp = {"hidden_layer_sizes": (32,), "max_iter": 300, "random_state": 0}
    return [
        ("LogisticRegression", "multi", lambda: lm.LogisticRegression(max_iter=500)),
        ("LogisticRegression", "binary", lambda: lm.LogisticRegression(max_iter=500)),
        ("LinearSVC", "multi", lambda: svm.LinearSVC()),
        ("RidgeClassifier", "multi", lambda: lm.RidgeClassifier()),
        ("SGDClassifier", "binary", lambda: lm.SGDClassifier(**seed)),
        ("DecisionTreeClassifier", "multi", lambda: tree.DecisionTreeClassifier(**seed)),
        ("RandomForestClassifier", "multi", lambda: ens.RandomForestClassifier(**trees)),
        ("ExtraTreesClassifier", "binary", lambda: ens.ExtraTreesClassifier(**trees)),
        ("GradientBoostingClassifier", "multi", lambda: ens.GradientBoostingClassifier(**trees)),
        ("GradientBoostingClassifier", "binary", lambda: ens.GradientBoostingClassifier(**trees)),
        ("SVC rbf probability", "multi", lambda: svm.SVC(probability=True, **seed)),
        ("SVC linear", "binary", lambda: svm.SVC(kernel="linear")),
        ("NuSVC poly", "multi", lambda: svm.NuSVC(kernel="poly")),
        ("KNeighborsClassifier", "multi", lambda: neighbors.KNeighborsClassifier()),
        ("GaussianNB", "multi", lambda: naive_bayes.GaussianNB()),
        ("MLPClassifier", "multi", lambda: neural_network.MLPClassifier(**mlp)),
        ("LinearRegression", "regression", lambda: lm.LinearRegression()),
        ("Ridge", "regression", lambda: lm.Ridge()),
        ("Lasso", "regression", lambda: lm.Lasso()),
        ("DecisionTreeRegressor", "regression", lambda: tree.DecisionTreeRegressor(**seed)),
        ("RandomForestRegressor", "regression", lambda: ens.RandomForestRegressor(**trees)),
        ("ExtraTreesRegressor", "regression", lambda: ens.ExtraTreesRegressor(**trees)),
        ("GradientBoostingRegressor", "regression", lambda: ens.GradientBoostingRegressor(**trees)),
        ("HistGradientBoostingRegressor", "regression", lambda: ens.HistGradientBoostingRegressor(max_iter=n)),  # noqa: E501
        ("SVR rbf", "regression", lambda: svm.SVR()),
        ("SVR linear", "regression", lambda: svm.SVR(kernel="linear")),
        ("NuSVR sigmoid", "regression", lambda: svm.NuSVR(kernel="sigmoid")),
        ("KNeighborsRegressor", "regression", lambda: neighbors.KNeighborsRegressor()),
        ("StandardScaler", "x", lambda: pre.StandardScaler()),
        ("MinMaxScaler", "x", lambda: pre.MinMaxScaler()),
        ("RobustScaler", "x", lambda: pre.RobustScaler()),
        ("Normalizer", "x", lambda: pre.Normalizer()),
        ("Binarizer", "x", lambda: pre.Binarizer()),
        ("PCA", "x", lambda: decomposition.PCA(4)),
        ("SimpleImputer", "x-nan", lambda: SimpleImputer()),
        ("Pipeline scaler+logreg", "multi", lambda: make(pre.StandardScaler(), lm.LogisticRegression())),  # noqa: E501
        ("Pipeline imputer+scaler+PCA+SVC", "multi-nan", lambda: make(
            SimpleImputer(), pre.StandardScaler(), decomposition.PCA(6), svm.SVC(probability=True, **seed)  # noqa: E501
        )),
        ("AdaBoostClassifier", "multi", lambda: ens.AdaBoostClassifier(n_estimators=n, **seed)),
        ("AdaBoostRegressor", "regression", lambda: ens.AdaBoostRegressor(n_estimators=n, **seed)),
        ("BaggingClassifier", "multi", lambda: ens.BaggingClassifier(n_estimators=10, **seed)),
        ("BaggingRegressor", "regression", lambda: ens.BaggingRegressor(n_estimators=10, **seed)),
        ("ExtraTreeClassifier", "binary", lambda: tree.ExtraTreeClassifier(**seed)),
        ("RandomForestClassifier", "binary", lambda: ens.RandomForestClassifier(**trees)),
        ("ElasticNet", "regression", lambda: lm.ElasticNet()),
        ("BayesianRidge", "regression", lambda: lm.BayesianRidge()),
        ("HuberRegressor", "regression", lambda: lm.HuberRegressor(max_iter=500)),
        ("SGDRegressor", "regression", lambda: lm.SGDRegressor(**seed)),
        ("Perceptron", "multi", lambda: lm.Perceptron(**seed)),
        ("PassiveAggressiveClassifier", "multi", lambda: lm.PassiveAggressiveClassifier(**seed)),
        ("LogisticRegression liblinear", "binary", lambda: lm.LogisticRegression(solver="liblinear")),  # noqa: E501
        ("LinearSVR", "regression", lambda: svm.LinearSVR(max_iter=5000, **seed)),
        ("SVC sigmoid", "multi", lambda: svm.SVC(kernel="sigmoid")),
        ("SVC rbf", "binary", lambda: svm.SVC()),
        ("NuSVR rbf", "regression", lambda: svm.NuSVR()),
        ("BernoulliNB", "multi", lambda: naive_bayes.BernoulliNB()),
        ("MLPRegressor", "regression", lambda: neural_network.MLPRegressor(**mlp)),
        ("MaxAbsScaler", "x", lambda: pre.MaxAbsScaler()),
        ("PolynomialFeatures", "x", lambda: pre.PolynomialFeatures(2)),
        ("TruncatedSVD", "x", lambda: decomposition.TruncatedSVD(4, **seed)),
        ("SimpleImputer median", "x-nan", lambda: SimpleImputer(strategy="median")),
        ("Pipeline scaler+RandomForest", "multi", lambda: make(pre.StandardScaler(), ens.RandomForestClassifier(**trees))),  # noqa: E501
        ("Pipeline PCA+Ridge", "regression", lambda: make(decomposition.PCA(6), lm.Ridge())),
        ("RandomForestRegressor *_as_tensor", "regression-tensor", lambda: ens.RandomForestRegressor(**trees)),  # noqa: E501
        ("GradientBoostingClassifier *_as_tensor", "multi-tensor", lambda: ens.GradientBoostingClassifier(**trees)),  # noqa: E501
    ]  # fmt: skip


def as_tensor(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its tree attributes ``nodes_values``, ``*_weights`` and ``base_values``
    written as ``*_as_tensor`` tensors, as LightGBM's and XGBoost's exporters write them."""
    from onnx import helper, numpy_helper

    names = ("nodes_values", "target_weights", "class_weights", "base_values", "nodes_hitrates")
    for node in model.graph.node:
        if not node.op_type.startswith("TreeEnsemble"):
            continue
        kept = []
        for a in node.attribute:
            if a.name in names and a.floats:
                t = numpy_helper.from_array(np.asarray(a.floats, np.float32))
                kept.append(helper.make_attribute(a.name + "_as_tensor", t))
            else:
                kept.append(a)
        del node.attribute[:]
        node.attribute.extend(kept)
    for op in model.opset_import:
        if op.domain == "ai.onnx.ml":
            op.version = max(op.version, 3)  # the *_as_tensor attributes exist from 3
    return model


def _fit_case(kind: str, make: Callable[[], Any], rows: int) -> tuple[onnx.ModelProto, dict]:
    base = kind.split("-")[0]
    dtype = np.float32
    x, y = _data("regression" if base == "regression" else base, rows, dtype)
    if kind.endswith("nan"):
        x = x.copy()
        x[np.random.default_rng(3).random(x.shape) < 0.05] = np.nan
    est = make()
    if base == "x":
        est.fit(x[:200])
    else:
        est.fit(np.nan_to_num(x[:200]) if not kind.endswith("nan") else x[:200], y[:200])
    model = convert(est, x[:1])
    if kind.endswith("tensor"):
        model = as_tensor(model)
    return model, {model.graph.input[0].name: x[200:]}


def _encoders() -> Iterator[tuple[str, Callable[[], tuple[onnx.ModelProto, dict]]]]:
    from sklearn import preprocessing
    from sklearn.feature_extraction import DictVectorizer

    words = np.array(["red", "green", "blue", "cyan", "plum"], dtype=object)
    rng = np.random.default_rng(4)

    def one_hot() -> tuple[onnx.ModelProto, dict]:
        x = words[rng.integers(0, 5, (300, 2))]
        est = preprocessing.OneHotEncoder(handle_unknown="ignore").fit(x)
        return convert(est, x[:1]), {"X": x}

    def ordinal() -> tuple[onnx.ModelProto, dict]:
        x = words[rng.integers(0, 5, (300, 2))]
        est = preprocessing.OrdinalEncoder().fit(x)
        return convert(est, x[:1]), {"X": x}

    def label_encoder() -> tuple[onnx.ModelProto, dict]:
        x = words[rng.integers(0, 5, 300)]
        est = preprocessing.LabelEncoder().fit(x)
        return convert(est, x[:1]), {"X": x}

    def dict_vectorizer() -> tuple[onnx.ModelProto, dict]:
        from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType

        rows = [{str(w): float(rng.random()) for w in words[: 1 + i % 5]} for i in range(20)]
        est = DictVectorizer(sparse=False).fit(rows)
        spec = [("X", DictionaryType(StringTensorType([1]), FloatTensorType([1])))]
        return convert(est, None, initial_types=spec), {"X": rows[7]}

    yield "OneHotEncoder strings", one_hot
    yield "OrdinalEncoder strings", ordinal
    yield "LabelEncoder strings", label_encoder
    yield "DictVectorizer", dict_vectorizer


def sklearn_cases(full: bool) -> Iterator[tuple[str, Callable, tuple[float, float]]]:
    rows = 2000 if full else 300
    for name, kind, make in _estimators(full):
        label = f"{name} ({kind.split('-')[0]})" if kind not in ("x", "x-nan") else name
        yield label, (lambda kind=kind, make=make: _fit_case(kind, make, rows)), (1e-4, 1e-4)
    for name, build in _encoders():
        yield name, build, (1e-5, 1e-5)
