"""Segments: TensorRT where it can, ONNX Runtime where it cannot (``fallback="onnxruntime"``).

A backend that composes executors over subgraphs of the final graph: the partition (partition), the values
between segments and their profiles (shapes), the build (build), the executor and its saved plan (executor), and
the report section (report). The passes, the check and validation do not change.
"""
