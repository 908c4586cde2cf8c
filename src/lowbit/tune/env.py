"""Where a measurement was taken: GPU name and driver / CUDA / Triton / torch versions."""

from __future__ import annotations

import functools
import platform
import subprocess


def device_name(device: str = "cuda") -> str:
    """`torch.cuda.get_device_name()` for a CUDA device, else 'cpu-<machine>'."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu-{platform.machine() or 'unknown'}"


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except Exception:  # no nvidia-smi: the driver's CUDA API version instead
        try:
            from cuda.bindings import driver

            err, version = driver.cuDriverGetVersion()
            return f"cuda-api-{version}" if int(err) == 0 else ""
        except Exception:
            return ""


@functools.lru_cache(maxsize=4)
def collect_env(device: str = "cuda") -> dict[str, str]:
    """gpu, driver, cuda, triton, torch of the process that measures on `device`."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = ""
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    return {
        "gpu": device_name(device),
        "driver": _driver_version() if on_gpu else "",
        "cuda": (torch.version.cuda or "") if on_gpu else "",
        "triton": triton_version,
        "torch": torch.__version__,
    }
