"""pipeline.runtime.ort."""
