"""Stage: check. Will TensorRT's ONNX parser take the graph? The judge (judge), the real parsers (real), the static
operator table (static, rules, ops) and its data (data).
"""
