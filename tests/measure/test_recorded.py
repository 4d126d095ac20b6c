"""The recorded backend: exact hits, log-linear interpolation between measured shapes, masking, oracle, speed."""

from __future__ import annotations

import math

import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload
from kernel_gym.measure import make_backend
from kernel_gym.measure.recorded import RecordedBackend, heldout_error
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, OUT_OF_RESOURCES, UNAVAILABLE, Measurement

CTX = Context("NVIDIA H200", "2.11.0", "3.6.0", "fused_moe", "h1")
TOKENS = (1, 2, 4, 8, 16, 32, 64)
SKEWS = (0.0, 1.2)
CFGS = [Config(BLOCK_M=bm, num_warps=w) for bm in (16, 64) for w in (4, 8)]


def _wl(t: int, s: float) -> MoEWorkload:
    return MoEWorkload(t, 8, 2, 64, 96, s)


def _time(t: int, s: float, c: Config) -> float:
    """A log-linear synthetic cost surface (test fixture): interpolation must reproduce it exactly."""
    a = {16: 1.0, 64: 2.0}[c["BLOCK_M"]] * (1.0 if c["num_warps"] == 4 else 1.3)
    return a * 2 ** (0.5 * math.log2(t)) * math.exp(0.3 * s) * (0.5 if c["BLOCK_M"] == 64 and t >= 16 else 1.0)


def _rows() -> list[Measurement]:
    rows = []
    for t in TOKENS:
        for s in SKEWS:
            wl = _wl(t, s)
            for c in CFGS:
                if c["BLOCK_M"] == 64 and c["num_warps"] == 8:
                    rows.append(Measurement("fused_moe", wl.key(), str(c), OUT_OF_RESOURCES, reason="smem"))
                elif t == 64 and s == 1.2 and c == CFGS[0]:
                    continue  # not measured at one corner
                else:
                    rows.append(Measurement("fused_moe", wl.key(), str(c), OK, median_ms=_time(t, s, c), spread=0.01,
                                            repeats=3, source="live"))
    return rows


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> RecordedBackend:
    path = tmp_path_factory.mktemp("rec") / "m.sqlite"
    with MeasurementStore(path) as store:
        store.put_many(CTX, _rows())
        snap = path.with_name("snap.jsonl.gz")
        store.export_snapshot(snap)
    return make_backend("recorded", path=snap, check_validity=False)


def test_exact_hit_returns_the_stored_row(backend: RecordedBackend) -> None:
    m = backend.measure("fused_moe", _wl(4, 0.0), CFGS[1])
    assert m.status == OK and m.source == "live" and m.median_ms == pytest.approx(_time(4, 0.0, CFGS[1]))
    f = backend.measure("fused_moe", _wl(4, 0.0), CFGS[3])
    assert f.status == OUT_OF_RESOURCES and f.reason == "smem"


def test_bilinear_interpolation_of_log_time(backend: RecordedBackend) -> None:
    m = backend.measure("fused_moe", _wl(6, 0.6), CFGS[1])
    assert m.status == OK and m.source == "recorded-interpolated"
    assert m.median_ms == pytest.approx(_time(6, 0.6, CFGS[1]), rel=1e-9)
    assert backend.measure("fused_moe", _wl(6, 0.6), CFGS[3]).status == OUT_OF_RESOURCES  # failed at every corner


def test_unavailable_is_never_invented(backend: RecordedBackend) -> None:
    outside = backend.measure("fused_moe", _wl(100, 0.0), CFGS[1])
    assert outside.status == UNAVAILABLE and "outside the measured range" in outside.reason
    corner = backend.measure("fused_moe", _wl(48, 0.6), CFGS[0])  # (64, 1.2) lacks this config
    assert corner.status == UNAVAILABLE and "not measured at bracketing" in corner.reason
    other = backend.measure("fused_moe", MoEWorkload(8, 16, 2, 64, 96), CFGS[1])  # other fixed dims
    assert other.status == UNAVAILABLE
    assert backend.measure("decode_attention", DecodeWorkload(4, 2, 64, 2, 100), CFGS[1]).status == UNAVAILABLE


def test_oracle_and_available_configs(backend: RecordedBackend) -> None:
    wl = _wl(48, 0.6)
    avail = backend.available_configs("fused_moe", wl)
    assert set(avail) == {CFGS[1], CFGS[2]}
    assert backend.best_config("fused_moe", wl) == CFGS[2]  # BLOCK_M 64 halves the time at t >= 16
    assert backend.best_config("fused_moe", _wl(1, 0.0)) == CFGS[0]
    with pytest.raises(LookupError, match="outside the measured grid"):
        backend.best_config("fused_moe", _wl(5000, 0.0))
    assert {w.key() for w in backend.workloads("fused_moe")} == {_wl(t, s).key() for t in TOKENS for s in SKEWS}


def test_heldout_error_on_a_log_linear_surface(backend: RecordedBackend) -> None:
    res = heldout_error(backend, "fused_moe")
    assert 0 < res["answered_fraction"] < 1  # edge shapes cannot be bracketed once left out
    # log-linear away from the BLOCK_M=64 step at t = 16, so most held-out answers are exact
    assert res["median_abs_rel_error"] < 1e-9 and 0.05 < res["p90_abs_rel_error"] < 0.5
    assert res["winner_time_over_best"] >= 1.0


def test_noisy_rows_are_left_out_as_unmeasured_not_failed() -> None:
    """A row whose samples spread beyond max_spread cannot rank configs: it answers like an unmeasured config
    (UNAVAILABLE where no interpolation covers it) and is counted, while its quiet neighbours still answer."""
    rows = _rows()
    target = _wl(8, 0.0).key()
    noisy = [r for r in rows if r.workload == target and r.config == str(CFGS[1])]
    assert len(noisy) == 1
    rows = [r if r is not noisy[0] else Measurement(r.kernel, r.workload, r.config, OK, median_ms=r.median_ms * 3,
                                                      spread=2.0, repeats=9, source="live") for r in rows]
    strict = RecordedBackend(groups=[(CTX, rows)], check_validity=False, max_spread=0.5)
    assert strict.noisy["fused_moe"] == 1
    m = strict.measure("fused_moe", _wl(8, 0.0), CFGS[1])
    assert m.source != "recorded" or m.median_ms != pytest.approx(noisy[0].median_ms * 3)
    assert m.status in (OK, UNAVAILABLE) and m.status != OUT_OF_RESOURCES
    if m.ok:  # interpolated from the quiet neighbours at 4 and 16 tokens: the clean surface, not the noisy 3x
        assert m.median_ms == pytest.approx(_time(8, 0.0, CFGS[1]), rel=1e-6)
    loose = RecordedBackend(groups=[(CTX, rows)], check_validity=False, max_spread=5.0)
    assert loose.noisy["fused_moe"] == 0
    assert loose.measure("fused_moe", _wl(8, 0.0), CFGS[1]).median_ms == pytest.approx(noisy[0].median_ms * 3)


def test_stored_ok_row_that_the_space_now_rejects_is_answered_invalid() -> None:
    """A row measured before a knob-space rule tightened (FUSE_SUM=1 above 96 tokens was measured ok, then found wrong
    at 128) must not reach the agent or the oracle, at an exact hit as well as by interpolation."""
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.fused_moe import FUSE_SUM_MAX_TOKENS

    family = get_family("fused_moe")
    space = family.space
    small, big = _wl(64, 0.0), _wl(FUSE_SUM_MAX_TOKENS + 32, 0.0)
    fused = Config({**family.default_config(small), "FUSE_SUM": 1})
    plain = Config({**fused, "FUSE_SUM": 0})
    assert space.why_invalid(fused, small) is None and space.why_invalid(plain, big) is None
    rows = [Measurement("fused_moe", wl.key(), str(c), OK, median_ms=1.0, spread=0.01, repeats=3, source="live")
            for wl in (small, big) for c in (fused, plain)]
    backend = RecordedBackend(groups=[(CTX, rows)])
    assert backend.measure("fused_moe", small, fused).ok
    m = backend.measure("fused_moe", big, fused)
    assert m.status == "invalid" and "FUSE_SUM" in m.reason
    assert backend.measure("fused_moe", big, plain).ok
    assert backend.best_config("fused_moe", big) == plain
    between = _wl(FUSE_SUM_MAX_TOKENS + 16, 0.0)
    assert backend.measure("fused_moe", between, fused).status == "invalid"


def test_packaged_rows_were_measured_by_the_kernels_as_they_are() -> None:
    """Every kernel's packaged rows carry its current version key (kernels/profiles.py), as the file stores it (no
    legacy hash left to map): a change that alters what is measured bumps the version (caught by
    tests/kernels/test_golden_outputs.py) and leaves these rows describing the old version: collect again."""
    import gzip
    import json

    from kernel_gym.kernels import get_family
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT, iter_snapshot
    from kernel_gym.measure.worker import family_store_key

    with gzip.open(PACKAGED_SNAPSHOT, "rt") as f:
        raw = {json.loads(line)["context"]["source_hash"] for line in f if line.startswith('{"context"')}
    assert raw == {"v1"}

    stored = {ctx.kernel: ctx.source_hash for ctx, _ in iter_snapshot(PACKAGED_SNAPSHOT)}
    assert set(stored) == {"prefill_attention", "decode_attention", "fused_moe", "vllm_fused_moe", "prefix_prefill"}
    for kernel, source_hash in stored.items():
        assert source_hash == family_store_key(get_family(kernel)), kernel
