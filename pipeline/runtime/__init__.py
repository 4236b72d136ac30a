"""pipeline.runtime."""
