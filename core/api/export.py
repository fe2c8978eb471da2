"""A compiled session as one file, and back (OpenVINO's ``export_model``/``import_model``).

``Session.export_compiled(path)`` writes a zip archive:

* ``model.onnx``: the model as the session imported it (before anychip's passes);
* ``placement.json``: anychip's version, the devices, the device of every node of the model
  by name, and the load options that shape placement and compilation;
* ``compiled/<key>.bin``: every graph-mode partition's compiled bytes the session stored or
  loaded (``core/compile/cache.py``'s files, whole: header, key, digest, payload).

``anychip.core.api.export.load_compiled(path)`` (``anychip.load_compiled``) puts the
artifacts into this machine's cache of compiled bytes (each checked by its header and digest
when it is read, as any other) and loads the model on the same devices with every node pinned
where it was and the cost model off: no calibration, no search, and each graph-mode
partition loaded instead of compiled. An archive of another anychip version is refused (its
keys would never match); with the compile cache off (``ANYCHIP_COMPILE_CACHE=0``) the
partitions are compiled again, with the same placement.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from anychip.errors import AnychipError, ModelError

__all__ = ["export_compiled", "load_compiled", "FORMAT"]

#: The archive's layout version (``placement.json``'s ``format``).
FORMAT = 1


def export_compiled(session: Any, path: str | Path, disk: Any, mark: int) -> Path:
    """Write ``session`` to ``path`` (see the module docstring); ``disk`` is the process's
    ``DiskCache`` (or None) and ``mark`` the length of its ``touched`` list at the load."""
    from anychip.ir.onnx import export_model
    from anychip.version import __version__

    if session.source_model is None:
        raise AnychipError("export_compiled: the session is closed")
    placement = {
        n.name: n.meta["device"] for n in session.model.graph.nodes if n.meta.get("device")
    }
    meta = {
        "format": FORMAT,
        "anychip": __version__,
        "devices": list(session.devices),
        "placement": placement,
        "options": session.export_options,
    }
    keys = list(dict.fromkeys(disk.touched[mark:])) if disk is not None else []
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("model.onnx", export_model(session.source_model).SerializeToString())
        z.writestr("placement.json", json.dumps(meta, indent=1))
        for key in keys:
            f = disk.file(key)
            if f.exists():
                z.write(f, f"compiled/{key}.bin")
    tmp.replace(path)
    return path


def load_compiled(path: str | Path, **options: Any) -> Any:
    """A session from an ``export_compiled`` archive; ``options`` as for ``anychip.load``
    (``placement``, ``cost_model`` and ``calibration`` are the archive's)."""
    from anychip.core.api.session import load
    from anychip.core.compile.cache import DiskCache
    from anychip.version import __version__

    if not isinstance(path, (str, Path)):
        raise ModelError(
            f"not an anychip compiled archive: load_compiled takes the path export_compiled "
            f"wrote, not a {type(path).__name__}"
        )
    try:
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelError(f"{path}: not an anychip compiled archive ({e})") from None
    with z:
        names = set(z.namelist())
        if not {"model.onnx", "placement.json"} <= names:
            raise ModelError(f"{path}: not an anychip compiled archive (no placement.json)")
        meta = json.loads(z.read("placement.json"))
        if meta.get("format") != FORMAT or meta.get("anychip") != __version__:
            raise ModelError(
                f"{path} was exported by anychip {meta.get('anychip')} (format "
                f"{meta.get('format')}); this is anychip {__version__}: export it again"
            )
        disk = DiskCache()
        for name in sorted(n for n in names if n.startswith("compiled/")):
            disk.adopt(Path(name).stem, z.read(name))
        model = z.read("model.onnx")
    for name in ("placement", "cost_model", "calibration"):
        options.pop(name, None)
    merged = {**meta.get("options", {}), **options}
    return load(
        model,
        devices=meta["devices"],
        placement=meta["placement"],
        cost_model=False,
        calibration="off",
        **merged,
    )
