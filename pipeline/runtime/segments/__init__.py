"""pipeline.runtime.segments."""
