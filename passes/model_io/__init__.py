"""Graph I/O and model storage, not passes: ONNX <-> graph-surgeon (graphs, onnx_import, onnx_export), weights in
external data files (external_data), and the collector pause while graphs are built (gc_pause).
"""
