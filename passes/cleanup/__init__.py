"""Passes that take nodes out: dead nodes, Identity and topological sort (graph), identity elements and Squeeze chains
(simplify), explicit Squeeze axes (squeeze_axes).
"""
