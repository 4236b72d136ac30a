"""Stage 1, export: the model and its sample to an ONNX graph and its I/O spec (``stage.export``), with the rewrites
of the torch.export program the exporter needs (``program_fixes``, ``histogram_edges``), composites traced through
static forms (``composites``) and the errors that say what failed (``errors``)."""

from pipeline.exporting.stage import ExportedGraph, export

__all__ = ["ExportedGraph", "export"]
