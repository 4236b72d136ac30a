"""The built-in converters: ATen ops the exporter cannot translate (or translates unlike PyTorch), lowered to ops
TensorRT builds. ``builtin.register_builtin_converters`` is the one list of what the default registry holds; each
module holds one family of ops with its ``@converter_case`` tests; ``numeric/`` holds the numerical methods they
share (Jacobi sweeps, LU/QR steps, the expression builder) and their coefficient tables (as data)."""
