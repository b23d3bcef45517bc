"""hpcpipe: an MPI benchmark suite for pipeline-parallel optimization.

Reference: Colin, Dos Santos, Scaman, "Theoretical Limits of Pipeline Parallel
Optimization and Application to Distributed Deep Learning", NeurIPS 2019
(arXiv 1910.05104).
"""

__version__ = "0.1.0"

from hpcpipe.pipeline.schedules import register_schedule  # noqa: E402

__all__ = ["__version__", "register_schedule"]
