"""Package data: TensorRT's ONNX parser operator matrix, its version deltas, its custom ops and the calibration record
against the real parser, with their sources (SOURCES.md).
"""
