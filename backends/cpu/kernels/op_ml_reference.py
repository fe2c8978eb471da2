"""ai.onnx.ml models (trees, linear models, SVMs, encoders) through onnx's reference ops.

These operators are table-driven interpreters of their attributes; a native kernel would
repeat onnx's reference implementation line for line, so they are wrapped (see
``_reference.py``) and the placement report names them "reference kernel". ZipMap,
DictVectorizer and CastMap are left out: they consume or produce maps, which anychip's
runtime does not carry.
"""

from __future__ import annotations

from anychip.backends.cpu.kernels._reference import register_reference

__all__: list[str] = []

_ML = "ai.onnx.ml"

for _op, _versions in (
    ("LabelEncoder", (1, 2, 4)),
    ("TreeEnsemble", (5,)),
    ("LinearClassifier", (1,)),
    ("LinearRegressor", (1,)),
    ("Scaler", (1,)),
    ("Normalizer", (1,)),
    ("Imputer", (1,)),
    ("OneHotEncoder", (1,)),
    ("FeatureVectorizer", (1,)),
    ("CategoryMapper", (1,)),
):
    for _since in _versions:
        register_reference(_op, domain=_ML, since=_since)

# TfIdfVectorizer (ai.onnx) is an n-gram table lookup of the same kind.
register_reference("TfIdfVectorizer", since=9)
