"""pipeline.runtime.tensorrt."""
