"""`lowbit.kernels.timing` under the name the network benchmark harness still imports."""

from ..kernels.timing import time_us

__all__ = ["time_us"]
