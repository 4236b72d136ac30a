"""The conversion report and the records of each stage it holds: data only (``to_dict``/``from_dict`` and summary
lines), so that a loaded artifact's report is read without importing the stages that wrote it."""
