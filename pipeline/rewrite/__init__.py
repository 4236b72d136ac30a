"""Stage: the graph passes as the pipeline runs them, and their debug mode (debug): which pass changed the outputs, or
broke the build.
"""
