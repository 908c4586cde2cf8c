"""Test session set-up: Triton runs in its interpreter when no CUDA GPU is present, tests
marked `gpu` are skipped there, and the tuning records are a fresh file of the session's."""

import os
import tempfile
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# the user's own tuning records never reach a test (lowbit.compile reads them by default)
os.environ["LOWBIT_RECORDS"] = str(Path(tempfile.mkdtemp(prefix="lowbit-test-")) /
                                   "records.sqlite")
if not HAS_CUDA:
    # must be set before triton is first imported (lowbit.kernels imports it lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
