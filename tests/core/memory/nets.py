"""Synthetic CNN graphs with realistic activation sizes, for planner tests.

Each builder returns a ``Net``: nodes in execution order as ``(output, shape, inputs,
elementwise)``, the graph input and outputs. Shapes are (C, H, W) float32 at batch 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from anychip.core.memory import Step, TensorLifetime, lifetimes

__all__ = ["Net", "NETS"]


@dataclass
class Net:
    name: str
    nodes: list[tuple[str, tuple[int, ...], tuple[str, ...], bool]] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    counter: int = 0

    def add(self, op: str, shape: tuple[int, ...], *inputs: str, elementwise: bool = False) -> str:
        self.counter += 1
        name = f"{op}{self.counter}"
        self.nodes.append((name, shape, inputs, elementwise))
        self.shapes[name] = shape
        return name

    def conv(self, x: str, channels: int, stride: int = 1) -> str:
        c, h, w = self.shapes[x]
        return self.add("conv", (channels, -(-h // stride), -(-w // stride)), x)

    def relu(self, x: str) -> str:
        return self.add("relu", self.shapes[x], x, elementwise=True)

    def addition(self, a: str, b: str) -> str:
        return self.add("add", self.shapes[a], a, b, elementwise=True)

    def concat(self, *xs: str) -> str:
        c = sum(self.shapes[x][0] for x in xs)
        return self.add("concat", (c, *self.shapes[xs[0]][1:]), *xs)

    def pool(self, x: str, stride: int = 2) -> str:
        c, h, w = self.shapes[x]
        return self.add("pool", (c, h // stride, w // stride), x)

    def upsample(self, x: str) -> str:
        c, h, w = self.shapes[x]
        return self.add("up", (c, h * 2, w * 2), x)

    def problem(self, output: str) -> tuple[list[TensorLifetime], dict[str, str]]:
        """Lifetimes (via ``lifetimes``) and in-place hints of the graph ending at ``output``."""
        steps = [Step(inputs, (name,)) for name, _, inputs, _ in self.nodes]
        sizes = {name: 4 * prod(shape) for name, shape in self.shapes.items()}
        ts = lifetimes(steps, sizes, inputs={"x"}, outputs={output})
        hints = {name: inputs[0] for name, _, inputs, ew in self.nodes if ew}
        return ts, hints


def chain(n: int = 30) -> tuple[Net, str]:
    net = Net("chain", shapes={"x": (3, 224, 224)})
    x = "x"
    for i in range(n):
        x = net.conv(x, 16 * (1 + i % 4), stride=2 if i in (3, 10, 20) else 1)
        x = net.relu(x)
    return net, x


def resnet18() -> tuple[Net, str]:
    net = Net("resnet18", shapes={"x": (3, 224, 224)})
    x = net.relu(net.conv("x", 64, stride=2))
    x = net.pool(x)
    for stage, channels in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            y = net.relu(net.conv(x, channels, stride))
            y = net.conv(y, channels)
            skip = net.conv(x, channels, stride) if stride == 2 else x
            x = net.relu(net.addition(y, skip))
    return net, net.pool(x, stride=7)


def mobilenet_v2() -> tuple[Net, str]:
    net = Net("mobilenet_v2", shapes={"x": (3, 224, 224)})
    x = net.relu(net.conv("x", 32, stride=2))
    for t, c, n, s in (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ):
        for i in range(n):
            stride = s if i == 0 else 1
            cin = net.shapes[x][0]
            y = net.relu(net.conv(x, cin * t)) if t != 1 else x
            y = net.relu(net.conv(y, cin * t, stride))  # depthwise
            y = net.conv(y, c)
            x = net.addition(y, x) if stride == 1 and cin == c else y
    return net, net.pool(net.relu(net.conv(x, 1280)), stride=7)


def densenet(blocks: int = 3, layers: int = 6, growth: int = 32) -> tuple[Net, str]:
    net = Net("densenet", shapes={"x": (3, 224, 224)})
    x = net.pool(net.relu(net.conv("x", 64, stride=2)))
    for b in range(blocks):
        features = [x]
        for _ in range(layers):
            cat = net.concat(*features) if len(features) > 1 else features[0]
            y = net.relu(net.conv(net.relu(cat), 4 * growth))
            features.append(net.conv(y, growth))
        x = net.concat(*features)
        if b < blocks - 1:
            x = net.pool(net.conv(net.relu(x), net.shapes[x][0] // 2))
    return net, net.pool(x, stride=7)


def unet(levels: int = 4) -> tuple[Net, str]:
    net = Net("unet", shapes={"x": (3, 256, 256)})
    x = "x"
    skips = []
    for level in range(levels):
        x = net.relu(net.conv(net.relu(net.conv(x, 32 << level)), 32 << level))
        skips.append(x)
        x = net.pool(x)
    x = net.relu(net.conv(x, 32 << levels))
    for level in reversed(range(levels)):
        x = net.concat(net.conv(net.upsample(x), 32 << level), skips[level])
        x = net.relu(net.conv(net.relu(net.conv(x, 32 << level)), 32 << level))
    return net, net.conv(x, 2)


def inception(modules: int = 6) -> tuple[Net, str]:
    """Diamonds: parallel branches of different widths joined by a concat."""
    net = Net("inception", shapes={"x": (3, 224, 224)})
    x = net.pool(net.relu(net.conv("x", 64, stride=2)))
    for m in range(modules):
        a = net.relu(net.conv(x, 64))
        b = net.relu(net.conv(net.relu(net.conv(x, 96)), 128))
        c = net.relu(net.conv(net.relu(net.conv(x, 16)), 32))
        d = net.relu(net.conv(net.pool(x, stride=1), 32))
        x = net.concat(a, b, c, d)
        if m % 2 == 1:
            x = net.pool(x)
    return net, net.pool(x, stride=7)


NETS = {f.__name__: f for f in (chain, resnet18, mobilenet_v2, densenet, unet, inception)}
