"""The README's "Quantization (INT8, FP8)" example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quantization_example_runs(capsys: object) -> None:
    section = (ROOT / "README.md").read_text().split("## Quantization (INT8, FP8)", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "the Quantization section has no python block"
    namespace: dict[str, object] = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    report = namespace["report"]
    assert report.precision == "int8" and report.share == 1.0  # type: ignore[attr-defined]
    assert len(report.scales()) == 2  # type: ignore[attr-defined]
