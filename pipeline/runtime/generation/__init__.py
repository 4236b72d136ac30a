"""pipeline.runtime.generation."""
