"""Every module imports on a machine without TensorRT, and importing them does not import tensorrt."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import importlib, pkgutil, sys
sys.modules["tensorrt"] = None  # as if TensorRT were not installed, even where it is
names = []
for package in ("converters", "passes", "pipeline"):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if info.name != "pipeline.__main__":
            importlib.import_module(info.name)
            names.append(info.name)
import pipeline
print(len(names), pipeline.backends.select_backend("auto").name)
"""


def test_every_module_imports_without_tensorrt() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, backend = done.stdout.split()
    assert int(count) >= 15
    assert backend == "onnxruntime"


def test_layering_nothing_below_pipeline_imports_it() -> None:
    """converters/ and passes/ must not import pipeline (the design's one-way flow)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(root))
        for package in ("converters", "passes")
        for path in (root / package).rglob("*.py")
        if any(line.strip().startswith(("import pipeline", "from pipeline")) for line in path.read_text().splitlines())
    ]
    assert offenders == []
    converters_importing_passes = [
        str(p.relative_to(root))
        for p in (root / "converters").rglob("*.py")
        if "from passes" in p.read_text() or "import passes" in p.read_text()
    ]
    assert converters_importing_passes == []
