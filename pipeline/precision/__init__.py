"""Stage: precision. What needs data: calibration, measured islands (measure), the accuracy search (search), the CPU
emulation of half graphs (emulation), the compute share (share), the real-builder gate (buildable) and the report
(report). The graph rewrite itself is passes.precision.
"""
