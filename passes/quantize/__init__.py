"""Explicit quantization as a graph rewrite: 8-bit formats, Q/DQ placement, and the rewrite itself."""
