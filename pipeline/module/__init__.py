"""The converted module (converted), its I/O spec (io_spec), its report (report), and the artifact it is saved as
(artifact) and loaded from (loading).
"""
