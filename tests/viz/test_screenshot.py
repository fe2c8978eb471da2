"""A headless Chromium screenshot of the HTML placement page: the page renders (not blank,
the devices' colours on screen). Debian's ``chromium`` is installed by ``.ci/run``; where it
is absent the test skips and says so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from anychip.viz import save_placement
from anychip.viz.view import device_colors

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)


def chromium(page: Path, profile: Path, *what: str) -> str:
    """Headless Chromium as the issue runs it: no network, no GPU, a throwaway profile."""
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", *what,
        "--window-size=1400,900", page.as_uri(),
    ]  # fmt: skip
    return subprocess.run(cmd, check=True, capture_output=True, timeout=180, text=True).stdout


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed here")
def test_html_page_renders_in_headless_chromium(mixed, tmp_path) -> None:
    from PIL import Image

    page = save_placement(mixed, tmp_path / "placement.html")
    png = tmp_path / "placement.png"
    chromium(page, tmp_path / "profile", f"--screenshot={png}")
    image = Image.open(png).convert("RGB")
    assert image.size == (1400, 900)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "a blank or nearly blank page"
    present = {c for _, c in colours}
    for device, hex_color in device_colors(mixed.devices).items():
        assert _rgb(hex_color) in present, f"no {device} node ({hex_color}) on screen"


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed here")
def test_the_page_script_runs(mixed, tmp_path) -> None:
    """The inline script ran to its end: it fitted the view (the viewport got a transform)."""
    page = save_placement(mixed, tmp_path / "placement.html")
    assert 'id="viewport">' in page.read_text()
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    assert re.search(r'id="viewport" transform="translate\([-\d.]+,[-\d.]+\) scale', dom), dom[:500]


def test_the_page_title_is_the_files_name_not_its_path(tmp_path) -> None:
    import numpy as np
    from onnx import TensorProto, helper

    import anychip
    from anychip.viz.view import placement_view

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    (tmp_path / "deep").mkdir()
    path = tmp_path / "deep" / "relu.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    with anychip.load(str(path), devices=["cpu"]) as sess:
        assert placement_view(sess).title == "relu.onnx on cpu"
        v = np.array([-1, 2], np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": v})[0], [0, 2])


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed here")
def test_a_large_graph_opens_at_full_size_text(tmp_path) -> None:
    """ResNet-50 (123 nodes) does not fit the window at full size: the page opens at scale 1
    (11 px node text), not shrunk to a fit where the text is unreadable."""
    import anychip
    from anychip.zoo import light_model

    model = light_model("resnet50", seed=0).SerializeToString()
    with anychip.load(model, devices=["cpu"], calibration="off") as sess:
        page = save_placement(sess, tmp_path / "placement.html")
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    scale = re.search(
        r'id="viewport" transform="translate\([-\d.]+,[-\d.]+\) scale\(([\d.]+)\)', dom
    )
    assert scale is not None, dom[:500]
    assert float(scale.group(1)) == 1.0, scale.group(0)


def _artifacts(tmp_path: Path) -> Path:
    """Where the screenshots are kept: ``$ANYCHIP_TEST_ARTIFACTS`` (``.ci/run`` sets it and
    lists the files), else the test's temporary folder."""
    folder = os.environ.get("ANYCHIP_TEST_ARTIFACTS")
    out = Path(folder) if folder else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed here")
@pytest.mark.parametrize("name", ["resnet50", "bert"])
def test_screenshots_at_the_opening_view_have_readable_text_and_an_overview(
    name: str, tmp_path: Path
) -> None:
    """The issue's pictures: ResNet-50 (npu,cpu) and a Hugging Face BERT (xpu,cpu: fallbacks
    and copies), screenshots kept as artifacts; at the opening view the node text is at full
    size (scale 1: 11 px), and the overview shows the whole graph with the lens on the part
    the main view shows (its top)."""
    from PIL import Image

    import anychip
    from anychip.zoo import light_model

    if name == "resnet50":
        model, devices, opts = light_model("resnet50", seed=0).SerializeToString(), "npu", {}
    else:
        model, devices = str(Path(__file__).parents[1] / "data" / "hf_bert_tiny.onnx"), "xpu"
        opts = {"cost_model": False}
    with anychip.load(model, devices=[devices, "cpu"], calibration="off", **opts) as sess:
        page = save_placement(sess, tmp_path / f"placement-{name}.html")
    png = _artifacts(tmp_path) / f"placement-{name}.png"
    chromium(page, tmp_path / "profile", f"--screenshot={png}")
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    scale = re.search(
        r'id="viewport" transform="translate\([-\d.]+,[-\d.]+\) scale\(([\d.]+)\)', dom
    )
    assert scale is not None and float(scale.group(1)) == 1.0, dom[:300]
    lens = re.search(
        r'id="lens" x="([-\d.e]+)" y="([-\d.e]+)" width="([\d.e]+)" height="([\d.e]+)"', dom
    )
    assert lens is not None, "the overview's lens was not placed"
    x, y, w, h = map(float, lens.groups())
    box = re.search(r'id="minimap" viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"', dom)
    assert box is not None
    assert w > 100 and h > 100, "the lens must cover the main view's part of the graph"
    assert h < float(box.group(2)), "the graph is taller than the window: the lens is a part"
    assert y < float(box.group(2)) / 4, "the opening view shows the top of the graph"
    image = Image.open(png).convert("RGB")
    corner = image.crop(
        (image.width - 190, image.height - 250, image.width - 14, image.height - 14)
    )
    colours = corner.getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 10, "the overview is blank"
