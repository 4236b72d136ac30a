"""The quantize stage (INT8, FP8, INT4, NVFP4): one flow for every format, each format's quantization, calibration,
AWQ, the accuracy search, the tolerance and the report."""
