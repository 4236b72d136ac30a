"""The quantize stage (INT8, FP8): calibration, the stage glue, its report, and the FP8 emulation for ONNX Runtime."""
