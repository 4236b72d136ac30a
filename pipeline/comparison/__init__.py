"""Comparison runs: where a converted graph departs from PyTorch. Runners (runners), statistics (stats), per-layer
matching (layers, tensorrt_layers), the run itself (run), the report (report) and its renderings (markdown, plots).
"""
