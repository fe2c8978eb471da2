"""The ai.onnx.ml ops without a native kernel, through onnx's reference ops.

Trees, SVMs, linear models, scalers, imputers, one-hot encoding and the map ops have native
kernels (``op_ml_*.py``); what is left here are CategoryMapper, the generic TreeEnsemble of opset
5 and FeatureVectorizer. They are wrapped (see
``_reference.py``) and the placement report names them "reference kernel".
"""

from __future__ import annotations

from anychip.backends.cpu.kernels._reference import register_reference

__all__: list[str] = []

_ML = "ai.onnx.ml"

for _op, _versions in (
    ("TreeEnsemble", (5,)),
    ("FeatureVectorizer", (1,)),
    ("CategoryMapper", (1,)),
):
    for _since in _versions:
        register_reference(_op, domain=_ML, since=_since)

# TfIdfVectorizer (ai.onnx) is an n-gram table lookup of the same kind.
register_reference("TfIdfVectorizer", since=9)
