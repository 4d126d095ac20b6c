"""Test setup: run Triton kernels under the CPU interpreter when no CUDA device is present.

TRITON_INTERPRET must be set before any module defining @triton.jit kernels is imported, so this runs at
conftest import time, before test collection imports kernel modules.
"""

import os
import warnings


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "false")
warnings.filterwarnings("ignore", message=".*noload.*")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (runs on the GPU machine; skipped elsewhere)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on the CPU")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the GPU machine (README: GPU parts)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
