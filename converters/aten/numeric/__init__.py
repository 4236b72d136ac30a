"""Numerical building blocks of the built-in converters: an expression builder over ONNX (``math_builder``),
Jacobi eigen sweeps (``jacobi``), elimination and reflection steps (``linalg_steps``) and the coefficient tables of
PyTorch's special functions (``tables``, reading ``data/*.json``)."""
