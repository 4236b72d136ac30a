"""The accuracy policy shared by validation, comparison and the precision and quantize stages: tolerances by the type
a graph computes in, the anchor to PyTorch's own error in that type, distribution statistics of random outputs, and
the shape-only rule of uninitialised outputs."""
