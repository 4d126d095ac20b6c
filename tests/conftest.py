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

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (runs on the GPU machine; skipped elsewhere)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on the CPU")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook (_keep_xdist_groups)
def pytest_collection_modifyitems(config, items):
    _keep_xdist_groups(config, items)
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the GPU machine (README: GPU parts)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _keep_xdist_groups(config, items):
    """--dist loadgroup sends the tests of one xdist_group to one worker by the "@GROUP" suffix pytest-xdist puts on
    their node ids. pytest-xdist (3.8) writes that suffix to item._nodeid, which pytest 9.2 no longer reads (a node id
    is item._id, a NodeId): the groups were silently dropped, and the Ray farm's module started a cluster on each
    worker. Where the suffix did not take, it is set here the way pytest 9.2 reads it."""
    if not getattr(config.option, "loadgroup", False):
        return
    try:  # pytest's private node-id type (9.2); another pytest keeps xdist's own grouping, whatever it does
        from _pytest.nodeid import NodeId
    except ImportError:
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid or not hasattr(item, "_id"):
            continue
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


@pytest.fixture(scope="session", autouse=True)
def _packaged_snapshot_parsed_once():
    """The packaged H200 snapshot (~155k rows, seconds to parse and check row by row) is read by every
    RecordedBackend() that a test, or the product code a test calls, builds on the default data (125 times in one
    run of the suite). Each worker parses it once and hands every later reader the same rows (Context and
    Measurement are frozen; the lists are fresh). Any other snapshot is read as before, and so is the packaged one
    after its file changed (mtime or size); a parse that raises caches nothing."""
    from kernel_gym.measure import store

    read, parsed = store._read_snapshot, {}
    packaged = store.PACKAGED_SNAPSHOT.resolve()

    def read_once(path):
        path = Path(path)
        if path.resolve() != packaged:
            yield from read(path)
            return
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        if key not in parsed:
            groups = list(read(path))
            parsed.clear()
            parsed[key] = groups
        for context, rows in parsed[key]:
            yield context, list(rows)

    store._read_snapshot = read_once
    yield
    store._read_snapshot = read
