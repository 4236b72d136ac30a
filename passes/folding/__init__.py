"""Constant folding with a size threshold (fold), evaluated on ONNX Runtime in bounded sessions (evaluation)."""
