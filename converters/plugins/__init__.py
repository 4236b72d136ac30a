"""Plugins: a torch.library op that runs as one node in TensorRT and on ONNX Runtime. The spec and its converter (spec),
the node format (nodes), output shapes from the fake kernel (shapes).
"""
