"""SVMClassifier and SVMRegressor (ai.onnx.ml), vectorised over rows.

The kernel matrix of every row against every support vector is one matrix product (float32,
as onnxruntime computes it). The classifier follows onnxruntime's CPU kernel, whose results
scikit-learn models are checked against: one-vs-one decision values and votes, the label is
the class with the most votes; with ``prob_a``/``prob_b`` the pairwise Platt probabilities
are coupled into class probabilities by libsvm's iterative method (Wu, Lin and Weng 2004),
in C where a compiler is found (``native/svm.c``), else in numpy for all rows at once;
without them, a binary model scores ``[-d, d]``. onnx's reference evaluator computes the
probabilities differently (it differs from onnxruntime and scikit-learn by a few percent),
so onnxruntime is the reference here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu import native
from anychip.backends.cpu.kernels._ml_common import ML, compiled, labels_of, post_transform
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError

__all__ = ["svm_classifier", "svm_regressor"]


#: Multiply-adds per BLAS call: OpenBLAS runs a product this small on the calling thread.
_SINGLE_THREAD_MACS = 2**18


def _gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (2-D) in row chunks small enough that OpenBLAS keeps each on the calling
    thread. These products are thin (a dozen features, a few hundred support vectors): on
    two cores shared with other jobs, OpenBLAS's threaded path took 1.5-7 ms for a 2000x12 @
    12x190 product that one thread does in 0.13 ms (waiting for the second thread)."""
    rows = max(1, _SINGLE_THREAD_MACS // max(1, a.shape[1] * b.shape[1]))
    if a.shape[0] <= rows:
        return a @ b
    out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
    for start in range(0, a.shape[0], rows):
        np.matmul(a[start : start + rows], b, out=out[start : start + rows])
    return out


def _kernel_matrix(
    x: np.ndarray, sv_t: np.ndarray, kind: str, params: list[float] | None
) -> np.ndarray:
    """``K(x, sv)`` for the support vectors given transposed and contiguous (``[F, n_sv]``:
    OpenBLAS multiplies a transposed view many times slower on a busy machine)."""
    gamma, coef0, degree = (list(params or []) + [0.0, 0.0, 0.0])[:3]
    if kind == "LINEAR":
        return _gemm(x, sv_t)
    if kind == "RBF":
        d = (x * x).sum(1)[:, None] + (sv_t * sv_t).sum(0)[None, :] - 2 * _gemm(x, sv_t)
        return np.exp(-np.float32(gamma) * np.maximum(d, 0))
    dot = np.float32(gamma) * _gemm(x, sv_t) + np.float32(coef0)
    if kind == "POLY":
        if float(degree) != int(degree) or degree < 1:
            return np.power(dot, np.float32(degree))
        out = dot.copy()
        for _ in range(int(degree) - 1):  # pow() per element is ~30x slower
            out *= dot
        return out
    if kind == "SIGMOID":
        return np.tanh(dot)
    raise KernelError(f"SVM: kernel_type {kind!r} is not LINEAR, POLY, RBF or SIGMOID")


def _rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], -1)


class _Svc:
    """The support vectors of one classifier node, split per class."""

    def __init__(self, a: dict[str, Any]) -> None:
        self.per_class = [int(v) for v in a.get("vectors_per_class") or []]
        self.n_classes = max(
            len(a.get("classlabels_ints") or []), len(a.get("classlabels_strings") or [])
        )
        self.coef = np.asarray(a["coefficients"], np.float32)
        self.rho = np.asarray(a["rho"], np.float32)
        self.prob_a = np.asarray(a.get("prob_a") or [], np.float32)
        self.prob_b = np.asarray(a.get("prob_b") or [], np.float32)
        n_sv = sum(self.per_class)
        if n_sv:
            sv = np.asarray(a["support_vectors"], np.float32).reshape(n_sv, -1)
            self.sv = np.ascontiguousarray(sv.T)
            self.coef = self.coef.reshape(self.n_classes - 1, n_sv)
        else:
            self.sv = None
            self.coef = np.ascontiguousarray(self.coef.reshape(self.n_classes, -1).T)
        self.start = np.concatenate([[0], np.cumsum(self.per_class)]).astype(int)
        self.pairs = [
            (i, j) for i in range(self.n_classes - 1) for j in range(i + 1, self.n_classes)
        ]

        self.linear_weights: np.ndarray | None = None
        if self.sv is not None:
            self.pair_weights = self._pair_weights()

    def _pair_weights(self) -> np.ndarray:
        """``[n_sv, pairs]``: the decision of pair (i, j) weighs class i's support vectors by
        coefficient row j-1 and class j's by row i (libsvm's one-vs-one layout), so all
        decisions are one matrix product."""
        s = self.start
        w = np.zeros((self.sv.shape[1], len(self.pairs)), np.float32)
        for p, (i, j) in enumerate(self.pairs):
            w[s[i] : s[i + 1], p] = self.coef[j - 1, s[i] : s[i + 1]]
            w[s[j] : s[j + 1], p] = self.coef[i, s[j] : s[j + 1]]
        return w

    def decisions(self, k: np.ndarray) -> np.ndarray:
        """``[N, pairs]`` one-vs-one decision values from the kernel matrix ``k``."""
        return _gemm(k, self.pair_weights) + self.rho[: len(self.pairs)]


def _coupled(r: np.ndarray, k: int) -> np.ndarray:
    """libsvm's multiclass probability from pairwise ``r[N, k, k]``, for all rows at once."""
    n = r.shape[0]
    q = np.zeros((n, k, k), np.float32)
    for i in range(k):
        for j in range(k):
            if j != i:
                q[:, i, i] += r[:, j, i] ** 2
        for j in range(i + 1, k):
            q[:, i, j] = -r[:, j, i] * r[:, i, j]
        for j in range(i):
            q[:, i, j] = q[:, j, i]
    p = np.full((n, k), 1.0 / k, np.float32)
    eps = 0.005 / k
    active = np.ones(n, bool)
    for _ in range(100):
        qp = np.einsum("nij,nj->ni", q, p)
        pqp = (p * qp).sum(1)
        active &= np.abs(qp - pqp[:, None]).max(1) >= eps
        if not active.any():
            break
        for i in range(k):
            diff = np.where(active, (-qp[:, i] + pqp) / q[:, i, i], 0).astype(np.float32)
            p[:, i] += diff
            pqp = (pqp + diff * (diff * q[:, i, i] + 2 * qp[:, i])) / (1 + diff) / (1 + diff)
            qp = (qp + diff[:, None] * q[:, i, :]) / (1 + diff)[:, None]
            p /= (1 + diff)[:, None]
    return p


def _probabilities(model: _Svc, dec: np.ndarray) -> np.ndarray:
    k = model.n_classes
    r = np.zeros((dec.shape[0], k, k), np.float32)
    for p, (i, j) in enumerate(model.pairs):
        v = dec[:, p] * model.prob_a[p] + model.prob_b[p]
        prob = np.clip(1 - 1 / (1 + np.exp(-v)), 1e-7, 1 - 1e-7)  # 1 - logistic(v)
        r[:, i, j], r[:, j, i] = prob, 1 - prob
    lib = native.library()
    if lib is None:
        return _coupled(r, k)
    ffi, r = native.ffi(), np.ascontiguousarray(r)
    p = np.empty((r.shape[0], k), np.float32)
    if lib.svm_couple(ffi.from_buffer("float[]", r), r.shape[0], k, ffi.from_buffer("float[]", p)):
        raise KernelError("SVMClassifier: out of memory coupling the pairwise probabilities")
    return p


@kernel("SVMClassifier", domain=ML, since=1, context=True)
def svm_classifier(ctx: KernelContext, x: np.ndarray, **a: Any) -> tuple[np.ndarray, np.ndarray]:
    model: _Svc = compiled(ctx, lambda: _Svc(a))
    x = _rows(x)
    ints, strings = a.get("classlabels_ints"), a.get("classlabels_strings")
    transform = a.get("post_transform") or "NONE"
    if model.sv is None:  # liblinear mode: one weight row per class, rho[0] added to all
        scores = x @ model.coef + model.rho[0]
        return labels_of(scores.argmax(1), ints, strings, "SVMClassifier"), post_transform(
            scores, transform
        ).astype(np.float32)
    kind = a.get("kernel_type") or "LINEAR"
    if kind == "LINEAR":  # K @ W = x @ (SV^T @ W): one product with the folded weights
        if model.linear_weights is None:
            model.linear_weights = model.sv @ model.pair_weights
        dec = x @ model.linear_weights + model.rho[: len(model.pairs)]
    else:
        dec = model.decisions(_kernel_matrix(x, model.sv, kind, a.get("kernel_params")))
    votes = np.zeros((x.shape[0], model.n_classes), np.int64)
    rows = np.arange(x.shape[0])
    for p, (i, j) in enumerate(model.pairs):
        np.add.at(votes, (rows, np.where(dec[:, p] > 0, i, j)), 1)
    labels = labels_of(votes.argmax(1), ints, strings, "SVMClassifier")
    if model.prob_a.size:
        scores = _probabilities(model, dec)
    elif model.n_classes == 2:
        scores = (
            np.concatenate([-dec, dec], 1)
            if transform == "NONE"
            else np.concatenate([1 - dec, dec], 1)
        )
        transform = "NONE"
    else:
        scores = dec
    return labels, post_transform(scores, transform).astype(np.float32)


@kernel("SVMRegressor", domain=ML, since=1, context=True)
def svm_regressor(ctx: KernelContext, x: np.ndarray, **a: Any) -> np.ndarray:
    x = _rows(x)
    n_sv = int(a.get("n_supports") or 0)

    kind = a.get("kernel_type") or "LINEAR"

    def build() -> tuple[np.ndarray | None, np.ndarray]:
        coef = np.asarray(a["coefficients"], np.float32)
        if n_sv:
            sv = np.asarray(a["support_vectors"], np.float32).reshape(n_sv, -1)
            if kind == "LINEAR":  # sum_i c_i (x . sv_i) = x . (sum_i c_i sv_i)
                return None, (coef @ sv).astype(np.float32)
            return np.ascontiguousarray(sv.T), coef
        return None, coef

    sv, coef = compiled(ctx, build)
    rho = np.float32((a.get("rho") or [0.0])[0])
    if sv is None:
        score = x @ coef + rho
    else:
        k = _kernel_matrix(x, sv, kind, a.get("kernel_params"))
        score = _gemm(k, coef.reshape(-1, 1)).reshape(-1) + rho
    if a.get("one_class"):
        score = np.where(score > 0, 1.0, -1.0).astype(np.float32)
    return post_transform(score.reshape(-1, 1), a.get("post_transform")).astype(np.float32)
