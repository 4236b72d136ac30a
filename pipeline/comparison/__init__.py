"""Comparison runs: where a converted graph departs from PyTorch. Runners (runners), statistics (stats), per-layer
matching (layers, tensorrt_layers), the run itself (run), the report (report) and its renderings (markdown, plots).

The package itself holds only the names a caller chooses among (the runners, the reference types, the per-layer memory
budget), so that the command line can offer them without importing the comparison.
"""

EXPORTED = "onnxruntime-exported"
FINAL = "onnxruntime"
TENSORRT = "tensorrt"
TENSORRT_RTX = "tensorrt-rtx"
RUNNERS: tuple[str, ...] = (EXPORTED, FINAL, TENSORRT, TENSORRT_RTX)
REFERENCE_DTYPES: tuple[str, ...] = ("float32", "float64")
#: bytes of intermediates per chunk of the per-layer comparison
DEFAULT_MEMORY_BUDGET = 512 << 20
