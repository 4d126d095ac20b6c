"""The recorded backend on prefix_prefill (issue 29): exact hits, log-bilinear interpolation over (chunk tokens,
prefix length) within one batch shape, the no-prefix edge shared by every prefix pattern, masking outside, and the
packaged H200 rows."""

from __future__ import annotations

import math

import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import PrefixPrefillWorkload, prefix_batch
from kernel_gym.measure import make_backend
from kernel_gym.measure.coverage import CoveredBackend
from kernel_gym.measure.recorded import PREFIX_OFFSET, RecordedBackend
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, UNAVAILABLE, Measurement

CTX = Context("NVIDIA H200", "2.11.0", "3.6.0", "prefix_prefill", "p1")
CHUNKS = (128, 512, 2048)
PREFIXES = (0, 512, 2048)
MIXES = ("single", "mixed4")
CFGS = [Config(PAGE_SIZE=16, LAYOUT="NHD", BLOCK_M=bm, BLOCK_N=16, num_warps=4, num_stages=2, NUM_SPLITS=1)
        for bm in (32, 64)]


def _wl(chunk: int, prefix: int, mix: str = "single") -> PrefixPrefillWorkload:
    return PrefixPrefillWorkload(32, 8, 128, *prefix_batch(chunk, prefix, mix))


def _time(w: PrefixPrefillWorkload, c: Config) -> float:
    """A surface log-linear in the backend's axes (test fixture): interpolation must reproduce it exactly."""
    a = 1.0 if c["BLOCK_M"] == 32 else 1.4
    return a * w.total_tokens ** 0.6 * (max(w.prefix_lens) + PREFIX_OFFSET) ** 0.8 * 1e-4


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> RecordedBackend:
    rows = [Measurement("prefix_prefill", w.key(), str(c), OK, median_ms=_time(w, c), spread=0.01, repeats=3,
                        source="live")
            for ch in CHUNKS for p in PREFIXES for mix in MIXES for w in [_wl(ch, p, mix)] for c in CFGS]
    path = tmp_path_factory.mktemp("rec") / "m.sqlite"
    with MeasurementStore(path) as store:
        store.put_many(CTX, rows)
        snap = path.with_name("snap.jsonl.gz")
        store.export_snapshot(snap)
    return make_backend("recorded", path=snap, check_validity=False)


def test_exact_hit_is_the_stored_row(backend: RecordedBackend) -> None:
    w = _wl(512, 2048, "mixed4")
    m = backend.measure("prefix_prefill", w, CFGS[1])
    assert m.status == OK and m.source == "live" and m.median_ms == pytest.approx(_time(w, CFGS[1]))


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize(("chunk", "prefix"), [(1024, 2048), (512, 1000), (300, 1500), (2048, 100), (128, 8)])
def test_interpolation_reproduces_a_log_linear_surface(backend: RecordedBackend, mix: str, chunk: int,
                                                       prefix: int) -> None:
    """Between measured chunks and prefixes of one batch shape; prefixes under 512 bracket with the no-prefix
    workloads, which belong to every prefix pattern (without that edge they would be unanswered)."""
    w = _wl(chunk, prefix, mix)
    for c in CFGS:
        m = backend.measure("prefix_prefill", w, c)
        assert m.status == OK and m.source == "recorded-interpolated", (w, m.reason)
        assert m.median_ms == pytest.approx(_time(w, c), rel=1e-9)
    assert backend.best_config("prefix_prefill", w) == CFGS[0]


def test_no_prefix_workloads_interpolate_along_the_chunk_axis(backend: RecordedBackend) -> None:
    w = _wl(1024, 0, "mixed4")
    m = backend.measure("prefix_prefill", w, CFGS[0])
    assert m.source == "recorded-interpolated" and m.median_ms == pytest.approx(_time(w, CFGS[0]))


@pytest.mark.parametrize(("chunks", "prefixes", "why"), [
    ((256, 256, 256, 256), (1000, 1000, 0, 0), "fixed dimensions"),  # another prefix pattern
    ((512, 16), (2048, 0), "fixed dimensions"),  # another batch shape
    ((512,), (4096,), "outside the measured range"),
    ((4096,), (512,), "outside the measured range"),
])
def test_other_shapes_and_out_of_range_are_unavailable(backend: RecordedBackend, chunks: tuple, prefixes: tuple,
                                                       why: str) -> None:
    m = backend.measure("prefix_prefill", PrefixPrefillWorkload(32, 8, 128, chunks, prefixes), CFGS[0])
    assert m.status == UNAVAILABLE and why in m.reason


@pytest.fixture(scope="module")
def packaged() -> RecordedBackend:
    return make_backend("recorded")


def test_packaged_data_answers_prefix_prefill(packaged: RecordedBackend) -> None:
    assert "prefix_prefill" in packaged.kernels() and len(packaged.workloads("prefix_prefill")) == 44
    # 308 rows of benchmarks/h200_prefix/, 88 PACK_GQA rows of benchmarks/new_knob_rows/
    assert packaged.describe()["kernels"]["prefix_prefill"]["rows"] == 396 - packaged.noisy["prefix_prefill"]
    lo, hi, mid = _wl(512, 2048), _wl(1024, 2048), _wl(768, 2048)
    shared = set(packaged.rows("prefix_prefill")[lo.key()]) & set(packaged.rows("prefix_prefill")[hi.key()])
    assert shared
    for text in shared:
        cfg = Config.parse(text)
        a, b = (packaged.rows("prefix_prefill")[w.key()][text] for w in (lo, hi))
        assert packaged.measure("prefix_prefill", lo, cfg) == a  # exact: the stored row
        m = packaged.measure("prefix_prefill", mid, cfg)
        assert m.status == OK and m.source == "recorded-interpolated"
        assert m.median_ms == pytest.approx(math.sqrt(a.median_ms * b.median_ms), rel=0.5)  # mid of log2 axis
        assert min(a.median_ms, b.median_ms) <= m.median_ms <= max(a.median_ms, b.median_ms)


def test_covered_backend_never_proxies_prefix_prefill(packaged: RecordedBackend) -> None:
    """No roofline for prefix_prefill: a chunk call outside its grid stays unanswered (the simulator's stand-in)."""
    covered = CoveredBackend(packaged)
    w = _wl(96, 0)
    cfg = Config.parse(next(iter(packaged.rows("prefix_prefill")[_wl(128, 0).key()])))
    assert covered.measure("prefix_prefill", w, cfg).status == UNAVAILABLE
    assert not covered.is_proxied("prefix_prefill", w) and covered.available_configs("prefix_prefill", w) == []


def test_packaged_prefix_rows_were_measured_by_the_kernel_as_it_is() -> None:
    """The merged rows carry prefix_prefill's current version key (a change that alters what is measured bumps it)."""
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT, iter_snapshot
    from kernel_gym.measure.worker import family_store_key

    stored = {ctx.source_hash for ctx, _ in iter_snapshot(PACKAGED_SNAPSHOT) if ctx.kernel == "prefix_prefill"}
    assert stored == {family_store_key(get_family("prefix_prefill"))}


def test_packaged_snapshot_holds_every_collected_prefix_row_as_collected() -> None:
    """The merge of benchmarks/h200_prefix/ lost nothing: each row (time, spread, samples, power state) is in the
    packaged snapshot unchanged, and `kernel-gym data` lists the kernel with them."""
    from pathlib import Path

    from kernel_gym.measure.store import PACKAGED_SNAPSHOT, iter_snapshot
    from kernel_gym.measure.summary import dataset_summary

    collected = Path(__file__).resolve().parents[2] / "benchmarks" / "h200_prefix" / "prefix_prefill.jsonl.gz"
    packaged = {(ctx, m.workload, m.config): m for ctx, ms in iter_snapshot(PACKAGED_SNAPSHOT) for m in ms
                if ctx.kernel == "prefix_prefill"}
    rows = [(ctx, m) for ctx, ms in iter_snapshot(collected) for m in ms]
    assert len(rows) == 308 and len(packaged) == 396  # and 88 PACK_GQA rows (benchmarks/new_knob_rows/)
    for ctx, m in rows:
        assert packaged[(ctx, m.workload, m.config)] == m and m.power
    info = dataset_summary(coverage=False)
    assert info["kernels"]["prefix_prefill"]["rows"] == 396 and info["kernels"]["prefix_prefill"]["shapes"] == 44
    assert info["rows"] >= 152_758 + 308  # the rows before the merge, and these
