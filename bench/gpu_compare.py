"""anychip on ``cuda`` against PyTorch eager on the same GPU, with the same weights.

For a machine with an NVIDIA GPU, PyTorch and CuPy (``bench/gpu_check.sh`` runs it). It has
never run: no machine of this project has a GPU. Models, built in PyTorch from seeded weights
and exported to ONNX (no download): a ResNet-50 (batch 1 and 32, 224x224) and a BERT-base-sized
encoder (12 layers, width 768, 12 heads, batch 32, sequence 128). For each: the largest
difference between the two outputs, the best-of-N time of each, and their ratio; then a
CUDA-graph replay of ResNet-50's first cuda partition against running it kernel by kernel.

    python bench/gpu_compare.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable

import numpy as np


def resnet50():
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(),
                nn.Conv2d(mid, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.short = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            return torch.relu(self.body(x) + self.short(x))

    layers, cin = [], 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        *layers,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2048, 1000),
    )


def encoder():
    from torch import nn

    layer = nn.TransformerEncoderLayer(
        768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True
    )
    return nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)


def _export(model, x) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.onnx.export(
        model, (x,), buf, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False
    )
    return buf.getvalue()


def _best(fn: Callable[[], object], sync: Callable[[], None], repeat: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def compare(name: str, model, shape: tuple[int, ...], repeat: int) -> dict:
    import cupy as cp
    import torch

    import anychip

    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(*shape)
    onnx_bytes = _export(model, x)
    gpu = model.cuda()
    xg = x.cuda()
    sess = anychip.load(onnx_bytes, devices=["cuda", "cpu"], cost_model=False)
    placed = sess.placement().by_device()
    xc = cp.asarray(xg)  # DLPack: the same memory, no copy
    with torch.no_grad():
        want = gpu(xg).float().cpu().numpy()
        (got,) = sess.run(None, {"x": xc}, output_device="cuda")
        got = cp.asnumpy(got)
        t_torch = _best(lambda: gpu(xg), torch.cuda.synchronize, repeat)
    t_any = _best(
        lambda: sess.run(None, {"x": xc}, output_device="cuda"),
        cp.cuda.Device().synchronize,
        repeat,
    )
    return {
        "model": name,
        "on cuda": f"{placed.get('cuda', 0)}/{sum(placed.values())}",
        "max diff": float(np.max(np.abs(got - want))),
        "torch ms": t_torch * 1e3,
        "anychip ms": t_any * 1e3,
        "anychip/torch": t_any / t_torch,
    }


def graph_replay(repeat: int) -> dict:
    """ResNet-50 batch 1: its largest cuda partition captured as a CUDA graph and replayed."""
    import cupy as cp
    import torch

    import anychip
    from anychip.backends.cuda.backend import _STATES
    from anychip.backends.cuda.graphs import CapturedPartition

    torch.manual_seed(0)
    sess = anychip.load(
        _export(resnet50().eval(), torch.randn(1, 3, 224, 224)), devices=["cuda", "cpu"]
    )
    part = max((p for p in sess.partitions if p.device == "cuda"), key=lambda p: len(p.nodes))
    state = next(iter(_STATES.values()))
    backend = anychip.core.plugin.host.get_registry().backends["cuda"]
    rng = np.random.default_rng(0)
    ins = [
        backend.to_device(rng.standard_normal([int(d) for d in v.shape]).astype(v.dtype.numpy))
        for v in part.inputs
    ]
    eager = part.program(ins)
    captured = CapturedPartition(part.program, state, ins)
    replay = captured(ins)
    diff = max(
        float(np.max(np.abs(backend.to_host(a) - backend.to_host(b))))
        for a, b in zip(eager, replay)
    )
    sync = cp.cuda.Device().synchronize
    t_eager = _best(lambda: part.program(ins), sync, repeat)
    t_graph = _best(lambda: captured(ins), sync, repeat)
    return {
        "model": f"resnet50 partition {part.index} ({len(part.nodes)} nodes)",
        "max diff": diff,
        "kernels ms": t_eager * 1e3,
        "graph ms": t_graph * 1e3,
        "graph/kernels": t_graph / t_eager,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    rows = [
        compare("resnet50 b1", resnet50(), (1, 3, 224, 224), args.repeat),
        compare("resnet50 b32", resnet50(), (32, 3, 224, 224), args.repeat),
        compare("bert-base encoder b32 s128", encoder(), (32, 128, 768), args.repeat),
    ]
    head = ("model", "on cuda", "max diff", "torch ms", "anychip ms", "ratio")
    print(f"{head[0]:28} {head[1]:>9} {head[2]:>9} {head[3]:>9} {head[4]:>10} {head[5]:>6}")
    for r in rows:
        print(
            f"{r['model']:28} {r['on cuda']:>9} {r['max diff']:9.2e} {r['torch ms']:9.2f} "
            f"{r['anychip ms']:10.2f} {r['anychip/torch']:6.2f}"
        )
    g = graph_replay(args.repeat)
    print(
        f"\nCUDA graph: {g['model']}: max diff {g['max diff']:.2e}, kernel by kernel "
        f"{g['kernels ms']:.2f} ms, replay {g['graph ms']:.2f} ms ({g['graph/kernels']:.2f}x)"
    )


if __name__ == "__main__":
    main()
