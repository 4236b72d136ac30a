"""The validation stage: the converted graph against PyTorch through Polygraphy's Comparator (``stage.validate``),
on the sample and inputs drawn like it (``draws``), each screened through PyTorch first (``screening``)."""

from pipeline.validation.stage import AccuracyReport, OutputAccuracy, validate

__all__ = ["AccuracyReport", "OutputAccuracy", "validate"]
