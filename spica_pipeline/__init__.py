"""spica-pipeline: a replay-backed smart sweeper for NVIDIA Dynamo deployments.

Importing the package has no side effects (no JAX, no Dynamo runtime, no environment changes).
"""

__version__ = "0.1.0"
