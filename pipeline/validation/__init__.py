"""The validation stage: the converted graph against PyTorch through Polygraphy's Comparator (``stage.validate``),
on the sample and inputs drawn like it (``draws``), each screened through PyTorch first (``screening``)."""

from pipeline.runtime.reports.accuracy import AccuracyReport, OutputAccuracy
from pipeline.validation.stage import validate

__all__ = ["AccuracyReport", "OutputAccuracy", "validate"]
