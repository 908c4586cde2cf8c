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


def needs_gpu(template: object) -> bool:
    """Whether a kernel template can only be measured on a CUDA GPU: its `needs_gpu`
    attribute if it has one, else CUDA C++ templates always and Triton templates unless
    Triton runs in its interpreter (TRITON_INTERPRET=1)."""
    import os

    flag = getattr(template, "needs_gpu", None)
    if flag is not None:
        return bool(flag)
    backend = getattr(template, "backend", "")
    return backend == "cuda" or (backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1")


def device_problem(device: str) -> str | None:
    """None when `device` ("cpu", "cuda", "cuda:i") can measure here, else why not. ValueError
    for a string that names no device."""
    import torch

    if not isinstance(device, str) or not (device == "cpu" or device == "cuda" or (
            device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device must be cpu, cuda or cuda:i, got {device!r}")
    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        return (f"no CUDA device for device={device!r} (torch.cuda.is_available() is False: "
                "no GPU, no driver, or a CPU build of torch)")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return f"no CUDA device {index}: this machine has {torch.cuda.device_count()}"
    return None
