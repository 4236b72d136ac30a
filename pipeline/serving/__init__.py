"""Serving converted models with NVIDIA's Triton Inference Server.

- :func:`pipeline.serve` (``pipeline serve``): artifacts as models of a real ``tritonserver`` on this machine, each
  in Triton's Python backend around :func:`pipeline.load` (dynamic batching, instances, token streaming).
- ``pipeline export-triton``: a model repository for a GPU Triton (TensorRT plans, ONNX models, configurations).
"""
