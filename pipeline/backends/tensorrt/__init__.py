"""The TensorRT and TensorRT-RTX backends: the library (library), parsing and building (build), the engine cache
(engine_cache), the executors (executor) and the raw runtime (runtime, rtx).
"""
