"""NonMaxSuppression: greedy per (batch, class) selection by score with IoU suppression.

Boxes whose IoU with an already selected box is strictly above ``iou_threshold`` are
dropped; boxes scoring below ``score_threshold`` never enter. Equal scores keep the lower
box index first. The selection is inherently sequential per class; each step's IoU against
the remaining candidates is one vectorised computation.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["non_max_suppression"]


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """[..., 4] boxes as (y_min, x_min, y_max, x_max)."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, bw, bh = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        return np.stack([yc - bh / 2, xc - bw / 2, yc + bh / 2, xc + bw / 2], axis=-1)
    y1, x1, y2, x2 = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return np.stack(
        [np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1
    )


def _iou(one: np.ndarray, many: np.ndarray) -> np.ndarray:
    ih = np.maximum(0, np.minimum(one[2], many[:, 2]) - np.maximum(one[0], many[:, 0]))
    iw = np.maximum(0, np.minimum(one[3], many[:, 3]) - np.maximum(one[1], many[:, 1]))
    inter = ih * iw
    area1 = (one[2] - one[0]) * (one[3] - one[1])
    area2 = (many[:, 2] - many[:, 0]) * (many[:, 3] - many[:, 1])
    union = area1 + area2 - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def _scalar(v: np.ndarray | None, default: float) -> float:
    if v is None or np.asarray(v).size == 0:
        return default
    return float(np.asarray(v).reshape(-1)[0])


@kernel("NonMaxSuppression", since=10)
def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_output_boxes_per_class: np.ndarray | None = None,
    iou_threshold: np.ndarray | None = None,
    score_threshold: np.ndarray | None = None,
    *,
    center_point_box: int = 0,
) -> np.ndarray:
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ModelError(
            f"NonMaxSuppression: boxes {boxes.shape} must be [B, N, 4] and scores "
            f"{scores.shape} [B, classes, N]"
        )
    limit = int(_scalar(max_output_boxes_per_class, 0))
    iou_t = _scalar(iou_threshold, 0.0)
    has_score_t = score_threshold is not None and np.asarray(score_threshold).size > 0
    score_t = _scalar(score_threshold, 0.0)
    corners = _corners(boxes, center_point_box)
    picked: list[tuple[int, int, int]] = []
    if limit <= 0:
        return np.zeros((0, 3), dtype=np.int64)
    for b in range(scores.shape[0]):
        for cls in range(scores.shape[1]):
            s = scores[b, cls].astype(np.float64)
            cand = np.argsort(-s, kind="stable")
            if has_score_t:
                cand = cand[s[cand] > score_t]
            chosen = 0
            while cand.size and chosen < limit:
                best = cand[0]
                picked.append((b, cls, int(best)))
                chosen += 1
                rest = cand[1:]
                cand = rest[_iou(corners[b, best], corners[b, rest]) <= iou_t]
    return np.asarray(picked, dtype=np.int64).reshape(-1, 3)
