"""`kernel-gym cycle` (deploy/cycle.py) on hand-made recorded times: decisions and exit codes, atomic folders,
install and rollback, the GPU confirmation path (a fake confirmer), the diff report and the MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernel_gym.cli.cycle import main as cycle_main
from kernel_gym.deploy import cycle
from kernel_gym.deploy import engine_export as ee
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.vllm_moe import to_entry
from kernel_gym.models import load_model
from kernel_gym.traffic import metrics
from kernel_gym.traffic.routing import topk_load_shares, zipf_popularity

MODEL = load_model("mixtral-8x7b")
SHAPE = ee.shard_shape(MODEL, 1)
DEV = "NVIDIA H200"
KEYS = (1, 16, 64, 256)


def cfg(bm: int, bn: int, warps: int = 4) -> Config:
    return Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                   "num_warps": warps, "num_stages": 3})


A, B, C = cfg(16, 64), cfg(32, 128), cfg(64, 128, 8)


def rows(shape: ee.MoEShape = SHAPE) -> list[ee.Row]:
    """A is best under uniform routing; B is 20% faster than A under Zipf 1.2; C is slower everywhere."""
    out = []
    for m in KEYS:
        base = 0.1 * (1 + m / 64)
        for skew, times in ((0.0, {A: base, B: base * 1.1, C: base * 1.5}),
                            (1.2, {A: base * 1.2, B: base, C: base * 1.5})):
            for c, t in times.items():
                out.append(ee.Row(DEV, "3.6.0", shape.workload(m, skew), c, t, 0.01, ee.engine_path_kind(shape, m)))
    return out


ROWS = rows()


def current_folder(tmp_path: Path, engine: str = "vllm", skew: float = 0.0, shape: ee.MoEShape = SHAPE) -> Path:
    d = tmp_path / "moe"
    ee.write_engine_file(d, engine, shape, DEV, {str(k): to_entry(A) for k in KEYS}, "3.6.0", {"skew": skew})
    return d


def scrape(tmp_path: Path, step_counts: list[int], name: str = "scrapes") -> Path:
    from tests.traffic.test_metrics import ZERO14, vllm_scrape, write

    d = tmp_path / name
    d.mkdir(exist_ok=True)
    write(d / "t0.txt", vllm_scrape([0] * 14, ZERO14, ZERO14), 100.0)
    write(d / "t1.txt", vllm_scrape(step_counts, [0] * 9 + [10, 0, 0, 0, 0], [0] * 6 + [10, 0, 0, 0, 0, 0, 0, 0]),
          700.0)
    return d


def experts(tmp_path: Path, skew: float) -> Path:
    shares = topk_load_shares(zipf_popularity(8, skew), 2)
    f = tmp_path / f"experts_{skew}.json"
    f.write_text(json.dumps({"counts": [list(np.round(shares * 1e5)) for _ in range(4)]}))
    return f


STEPS = [10, 20, 30, 10, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0]  # M from 1 to 64


def cycle_on(current: Path, traffic: list[Path], tmp_path: Path, **kw) -> tuple[int, dict]:
    """A zero-shot cycle of `current` on ROWS without MLflow (`kw` overrides run_cycle's keyword arguments)."""
    return cycle.run_cycle(**{"model": "mixtral-8x7b", "engine": "vllm", "current": current, "no_mlflow": True,
                              "report_dir": tmp_path / "report", "traffic": traffic, "rows": ROWS, **kw})


def test_pricer_exact_at_measured_points_estimated_between():
    p = cycle.Pricer(SHAPE, DEV, ROWS)
    t, est = p.time(A, 16, 0.0)
    assert t == pytest.approx(0.1 * (1 + 16 / 64)) and not est
    t2, est2 = p.time(A, 32, 0.0)
    assert est2 and p.time(A, 16, 0.0)[0] < t2 < p.time(A, 64, 0.0)[0]
    t3, est3 = p.time(B, 64, 0.6)  # between the measured skews
    assert est3 and p.time(B, 64, 1.2)[0] < t3 < p.time(B, 64, 0.0)[0]
    assert p.time(A, 1024, 0.0)[0] == pytest.approx(p.time(A, 256, 0.0)[0] * 4)  # linear above the grid
    with pytest.raises(ValueError, match="no recorded vllm_fused_moe times"):
        cycle.Pricer(ee.shard_shape(load_model("olmoe-1b-7b"), 1), DEV, ROWS)


def test_skew_shift_proposes_an_unconfirmed_change_written_atomically(tmp_path):
    cur = current_folder(tmp_path)
    before = {p.name: p.read_text() for p in cur.iterdir()}
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)], tmp_path)
    assert code == cycle.UNCONFIRMED and rep["decision"] == "change proposed, unconfirmed"
    assert rep["skew"] == pytest.approx(1.2, abs=0.1) and rep["skew_source"] == "per-expert counts"
    assert rep["expected_gain"] == pytest.approx(1.2, rel=0.03)
    assert 0.0 <= rep["price_new"]["estimated_share"] <= 1.0
    new = Path(rep["new_folder"])
    assert new == (tmp_path / "moe.next").resolve()
    table = json.loads((new / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text())
    assert set(table) == {str(k) for k in KEYS}
    assert table["16"] == to_entry(B) and table["256"] == to_entry(A)  # no steps near 256: left alone
    assert metrics.load_profile(new / metrics.PROFILE_FILE).skew == pytest.approx(rep["skew"])
    side = json.loads((new / ee.SIDECAR).read_text())["files"]["E=8,N=14336,device_name=NVIDIA_H200.json"]
    assert side["estimate"] is True and side["cycle"]["decision"] == rep["decision"]
    assert {p.name: p.read_text() for p in cur.iterdir()} == before  # the current folder is untouched
    assert not list(tmp_path.glob(".moe.next.tmp-*"))
    md = (tmp_path / "report" / cycle.REPORT_MD).read_text()
    assert "expected gain x1.2" in md and "M 16:" in md
    assert json.loads((tmp_path / "report" / cycle.REPORT_JSON).read_text())["exit_code"] == 11


def test_no_change_when_the_traffic_did_not_move(tmp_path):
    cur = current_folder(tmp_path)
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)]
    code, rep = cycle_on(cur, traffic, tmp_path)
    assert code == cycle.UNCONFIRMED
    code2, rep2 = cycle_on(Path(rep["new_folder"]), traffic, tmp_path, out=tmp_path / "again")
    assert code2 == cycle.NO_CHANGE and rep2["moved_keys"] == 0 and "new_folder" not in rep2
    assert not (tmp_path / "again").exists()


def test_uniform_traffic_on_uniform_files_needs_no_change(tmp_path):
    cur = current_folder(tmp_path)
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 0.0)], tmp_path)
    assert code == cycle.NO_CHANGE
    assert rep["moved_keys"] >= 3 and all(k["why"] in ("no stored profile", "no traffic") for k in rep["keys"])
    assert rep["expected_gain"] == pytest.approx(1.0)


def test_m_shift_moves_only_the_keys_whose_share_changed(tmp_path):
    cur = current_folder(tmp_path)
    metrics.TrafficProfile("vllm", ["old"], 600, 10, 100, {1: 0.5, 16: 0.5}, {}, {},
                           routing={"skew": 0.0}).save(cur / metrics.PROFILE_FILE)
    code, rep = cycle_on(cur, [scrape(tmp_path, [0, 0, 0, 0, 0, 0, 0, 50, 0, 0, 0, 0, 0, 0]),
                               experts(tmp_path, 0.0)], tmp_path)
    moved = {k["key"]: k["why"] for k in rep["keys"] if k["moved"]}
    assert set(moved) == {256} and moved[256].startswith("share 0.0% -> 100.0%")
    assert code == cycle.NO_CHANGE  # A is already the best at 256 under uniform routing


def test_gpu_path_keeps_only_confirmed_changes(tmp_path):
    class Fake:
        def __init__(self, confirm: bool) -> None:
            self.confirm, self.gpu_s, self.calls = confirm, 0.0, []

        def tune_key(self, m, skew, current, candidates, min_gain):
            self.calls.append((m, current, candidates))
            self.gpu_s += 1.5
            return {"confirmed": self.confirm, "config": str(B), "timed": {str(current): 1.0}}

    cur = current_folder(tmp_path)
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)]
    yes = Fake(True)
    code, rep = cycle_on(cur, traffic, tmp_path, gpu=True, confirmer=yes)
    assert code == cycle.CONFIRMED and rep["confirmed_keys"] == rep["changed_keys"] == 3
    assert rep["gpu_s"] == pytest.approx(1.5 * len(yes.calls)) and all(A not in c for _, _, c in yes.calls)
    no = Fake(False)
    code, rep = cycle_on(cur, traffic, tmp_path, gpu=True, out=tmp_path / "x", confirmer=no)
    assert code == cycle.NO_CHANGE and rep["changed_keys"] == 0 and not (tmp_path / "x").exists()


def test_install_then_rollback(tmp_path, capsys):
    cur = current_folder(tmp_path)
    old = (cur / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text()
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)], tmp_path, install=True)
    assert code == cycle.UNCONFIRMED
    assert (cur / metrics.PROFILE_FILE).exists() and (tmp_path / "moe.prev" / ee.SIDECAR).exists()
    assert (cur / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text() != old
    assert cycle_main(["--current", str(cur), "--rollback"]) == 0
    assert (cur / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text() == old
    assert not (cur / metrics.PROFILE_FILE).exists() and (tmp_path / "moe.undone" / metrics.PROFILE_FILE).exists()
    with pytest.raises(FileNotFoundError, match="no previous folder"):
        cycle.rollback(cur)


def test_sglang_folder_keeps_its_triton_version(tmp_path):
    cur = tmp_path / "sg"
    from tests.traffic.test_metrics import sglang_scrape, write

    ee.write_engine_file(cur, "sglang", SHAPE, DEV, {str(k): to_entry(A) for k in KEYS}, "3.8.0", {})
    d = tmp_path / "sg_scrapes"
    d.mkdir()
    write(d / "0.txt", sglang_scrape([0] * 6, [0] * 5, 0), 100.0)
    write(d / "1.txt", sglang_scrape([10, 10, 0, 0, 0, 0], [20, 0, 0, 0, 0], 8), 400.0)
    code, rep = cycle_on(cur, [d, experts(tmp_path, 1.2)], tmp_path, engine="sglang")
    assert code == cycle.UNCONFIRMED
    assert rep["engine_file"].startswith("configs/triton_3_8_0/")
    new = Path(rep["new_folder"])
    assert sorted(p.name for p in (new / "configs").iterdir()) == ["triton_3_8_0"]


def test_bad_inputs_get_one_line_errors(tmp_path, capsys):
    from kernel_gym import cli

    empty = tmp_path / "empty"
    empty.mkdir()
    rc = cli.main(["cycle", "--model", "mixtral-8x7b", "--engine", "vllm", "--current", str(empty),
                   "--traffic", str(tmp_path), "--no-mlflow"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no vLLM config file E=8,N=14336" in err and "kernel-gym export" in err and "\n" not in err
    cur = current_folder(tmp_path)
    (cur / "E=8,N=14336,device_name=NVIDIA_H200.json").write_text("{not json")
    with pytest.raises(ValueError, match="not an engine fused-MoE config file"):
        cycle_on(cur, [scrape(tmp_path, STEPS)], tmp_path)
    with pytest.raises(ValueError, match="--model and --engine are required"):
        cycle.run_cycle(current=cur, rows=ROWS)


def test_mlflow_run_per_cycle(tmp_path):
    pytest.importorskip("mlflow")
    from tests.fakes.mlflow_store import fresh_store

    uri = fresh_store(tmp_path)
    cur = current_folder(tmp_path)
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)], tmp_path, no_mlflow=False,
                         tracking_uri=uri)
    import mlflow

    run = mlflow.get_run(rep["mlflow_run_id"])
    assert run.data.tags["decision"] == "change proposed, unconfirmed"
    assert run.data.metrics["exit_code"] == 11 and run.data.metrics["changed_keys"] == 3
    assert run.data.params["engine"] == "vllm"


def test_rows_too_noisy_to_rank_price_their_config_but_are_never_chosen(tmp_path):
    d = cfg(16, 32, 8)
    noisy = [*ROWS, *(ee.Row(DEV, "3.6.0", SHAPE.workload(m, 1.2), d, 0.01, 0.9, ee.engine_path_kind(SHAPE, m))
                      for m in KEYS)]
    p = cycle.Pricer(SHAPE, DEV, noisy)
    assert p.time(d, 16, 1.2)[0] == pytest.approx(0.01)
    assert d not in p.candidates(16, 1.2) and p.oracle(16, 1.2)[0] > 0.01
    cur = current_folder(tmp_path)
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)], tmp_path, rows=noisy)
    assert code == cycle.UNCONFIRMED and all(k["proposed"] != str(d) for k in rep["keys"])


def test_gpu_confirmer_logic_under_the_interpreter():
    """The --gpu path's own code on the CPU (interpreter, wall clocks, a tiny fp32 shape): the current entry is
    checked and timed first, candidates after it, and a change is reported only with a paired round behind it."""
    from kernel_gym.deploy.cycle_gpu import GpuConfirmer

    shape = ee.MoEShape(4, 64, 64, 2, "float32")
    cur = Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
                  "num_stages": 2})
    cand = cur.replace(BLOCK_SIZE_N=64)
    g = GpuConfirmer(shape, budget_s=1.5, rows=[], smoke=True)
    g.pair_rounds = 2
    res = g.tune_key(24, 1.2, cur, [cand], 0.01)
    assert str(cur) in res["timed"] and not res.get("skipped")
    assert res["confirmed"] == ("paired" in res and res["paired"]["gain"] >= 1.01)
    assert g.gpu_s > 0


def test_gpu_confirmer_proposes_candidates_without_recorded_rows_or_cycle_candidates(monkeypatch):
    """A shape the rows never measured gives the confirmer no candidates: it still tries the current entry's one-knob
    neighbours (timings faked: which configs are tried is the point, not their speed)."""
    from types import SimpleNamespace

    from kernel_gym.deploy.cycle_gpu import GpuConfirmer
    from kernel_gym.kernels import vllm_moe as vm
    from kernel_gym.measure import engine_timing

    shape = ee.MoEShape(4, 64, 64, 2, "float32")
    cur = Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
                  "num_stages": 2})
    tried = []

    def measure(inputs, ref, c, timer, sync, engine):
        tried.append(c)
        return SimpleNamespace(median_ms=1.0 if c == cur else 0.9, status="ok", reason=""), (lambda: None)

    monkeypatch.setattr(engine_timing, "measure_config", measure)
    monkeypatch.setattr(engine_timing, "confirm", lambda timer, a, b, rounds, gain: (True, 1.0, 0.9))
    res = GpuConfirmer(shape, budget_s=60.0, rows=[], smoke=True).tune_key(24, 0.0, cur, [], 0.01)
    assert tried[0] == cur and len(tried) > 1
    assert set(tried[1:]) <= set(vm.neighbours(cur, shape.workload(24, 0.0)))
    assert res["confirmed"] and res["config"] in {str(c) for c in tried[1:]}


def test_a_noisy_current_entry_is_judged_on_the_candidates_noise_and_said_so(tmp_path):
    noisy = [r if r.config != A else ee.Row(r.device, r.triton_version, r.workload, A, r.median_ms, 0.9, r.path)
             for r in ROWS]
    cur = current_folder(tmp_path)
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)], tmp_path, rows=noisy)
    changed = [k for k in rep["keys"] if k["proposed"] != k["current"]]
    assert code == cycle.UNCONFIRMED and changed
    assert all("too noisy to rank" in k["why"] for k in changed)


def test_out_that_would_lose_files_is_refused_before_the_work(tmp_path):
    """--out set to --current replaced the live files with the unconfirmed change and no .prev; an --out holding
    anything else (another export) was deleted."""
    cur = current_folder(tmp_path)
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)]
    before = {p.name: p.read_text() for p in cur.iterdir()}
    with pytest.raises(ValueError, match="is the --current folder.*--install"):
        cycle_on(cur, traffic, tmp_path, out=cur)
    other = tmp_path / "sglang_export"
    other.mkdir()
    (other / "mine.json").write_text("{}")
    with pytest.raises(ValueError, match="not a folder an earlier cycle wrote"):
        cycle_on(cur, traffic, tmp_path, out=other)
    assert (other / "mine.json").read_text() == "{}"
    assert {p.name: p.read_text() for p in cur.iterdir()} == before
    code, rep = cycle_on(cur, traffic, tmp_path)  # a cycle's own proposal (moe.next) may be made again
    code2, rep2 = cycle_on(cur, traffic, tmp_path)
    assert code == code2 == cycle.UNCONFIRMED and rep2["new_folder"] == rep["new_folder"]


def test_traffic_the_rows_cannot_price_is_not_called_no_change(tmp_path):
    """The live file's configs never measured at the shape (an engine's own table): nothing priced, and the cycle said
    "0.0000 ms -> 0.0000 ms", no change needed (exit 0)."""
    cur = current_folder(tmp_path)  # every key holds A
    others = [r for r in ROWS if r.config != A]
    with pytest.raises(ValueError, match="none of the traffic's batch sizes can be priced.*--gpu"):
        cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 0.0)], tmp_path, rows=others)


def test_a_skew_beyond_the_measured_ones_is_said_to_be_priced_at_the_nearest(tmp_path):
    """Rows measured at skews 0 and 1.2; traffic at Zipf 2.5 is priced at 1.2 (estimated), and the report and the
    printed summary say so; traffic inside the range gets no such note."""
    cur = current_folder(tmp_path)
    code, rep = cycle_on(cur, [scrape(tmp_path, STEPS), experts(tmp_path, 2.5)], tmp_path)
    assert rep["skew"] > 1.5 and rep["skew_measured"] == [0.0, 1.2]
    assert rep["price_new"]["estimated_share"] == pytest.approx(1.0)
    md = (tmp_path / "report" / cycle.REPORT_MD).read_text()
    assert "outside the measured skews (0.00-1.20): priced at 1.20" in md
    assert any("outside the measured skews" in line for line in cycle.summary_lines(code, rep, tmp_path))
    code, rep = cycle_on(current_folder(tmp_path / "in"), [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)],
                         tmp_path / "in")
    assert not any("outside the measured" in line for line in cycle.summary_lines(code, rep, tmp_path))
    assert cycle.skew_range_note(1.2, [0.0, 1.2]) == "" and cycle.skew_range_note(-0.3, [0.0, 1.2])


class TimedFake:
    """A confirmer that answers as GpuConfirmer does: the current entry timed at `cur_ms`, and (with `new_ms`) a
    paired round against B that confirms it; with `timed=False` nothing is timed (the budget ran out)."""

    def __init__(self, cur_ms: float = 1.0, new_ms: float | None = 0.8, timed: bool = True) -> None:
        self.cur_ms, self.new_ms, self.timed, self.gpu_s, self.calls = cur_ms, new_ms, timed, 0.0, []

    def tune_key(self, m, skew, current, candidates, min_gain):
        self.calls.append((m, current, candidates))
        if not self.timed:
            return {"M": m, "timed": {}, "dropped": {}, "confirmed": False, "skipped": "GPU budget reached"}
        self.gpu_s += 1.0
        res = {"M": m, "timed": {str(current): self.cur_ms}, "dropped": {}, "confirmed": False}
        if self.new_ms is not None:
            res["timed"][str(B)] = self.new_ms
            res["paired"] = {"current_ms": self.cur_ms, "new_ms": self.new_ms, "gain": self.cur_ms / self.new_ms,
                             "pick": str(B)}
            res["confirmed"], res["config"] = self.cur_ms / self.new_ms >= 1 + min_gain, str(B)
        return res


def test_gpu_cycles_a_shape_the_rows_never_measured(tmp_path, capsys):
    """Qwen3-30B-A3B at TP 8 (E=128, N=96) has no recorded rows: the CPU refuses it (clear message), --gpu was refused
    too (the Pricer raised before the GPU branch); now the GPU times it and the report says the prices are its."""
    shape = ee.shard_shape(load_model("qwen3-30b-a3b"), 8)
    cur = current_folder(tmp_path, shape=shape)
    traffic = [scrape(tmp_path, STEPS)]  # no expert counts: uniform routing assumed
    kw = {"model": "qwen3-30b-a3b", "tp": 8}
    with pytest.raises(ValueError, match="no recorded vllm_fused_moe times for E=128, N=96.*--gpu"):
        cycle_on(cur, traffic, tmp_path, **kw)
    fake = TimedFake()
    code, rep = cycle_on(cur, traffic, tmp_path, gpu=True, confirmer=fake, **kw)
    assert code == cycle.CONFIRMED and rep["changed_keys"] == rep["confirmed_keys"] == len(fake.calls) == 3
    assert all(c for _, _, c in fake.calls)  # the nearest measured shape's winners are proposed
    assert rep["price_source"] == "gpu" and rep["expected_gain"] == pytest.approx(1.25)
    assert rep["price_current"]["ms"] == pytest.approx(1.0 * (1 - rep["unpriced_step_share"]))
    md = (tmp_path / "report" / cycle.REPORT_MD).read_text()
    assert "from this cycle's GPU timings" in md and "per-M best" not in md
    assert "GPU timings" in cycle.summary_lines(code, rep, tmp_path)[0]
    code, rep = cycle_on(cur, traffic, tmp_path, gpu=True, confirmer=TimedFake(timed=False), out=tmp_path / "x", **kw)
    assert code == cycle.NO_CHANGE and rep["price_source"] == "none" and rep["price_current"]["ms"] is None
    assert rep["unpriced_step_share"] == pytest.approx(1.0) and rep["expected_gain"] is None
    assert "**not priced**" in (tmp_path / "report" / cycle.REPORT_MD).read_text()
    assert "not priced" in cycle.summary_lines(code, rep, tmp_path)[0]


def test_an_expert_parallel_folder_is_found_and_priced(tmp_path, capsys):
    """Mixtral at EP 2 runs E=4 experts per GPU (export --ep 2 names the file E=4,...); cycle had no --ep and looked
    for E=8."""
    from kernel_gym import cli

    shape = ee.shard_shape(MODEL, 1, ep=2)
    cur = current_folder(tmp_path, shape=shape)
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)]
    code, rep = cycle_on(cur, traffic, tmp_path, ep=2, rows=rows(shape))
    assert rep["engine_file"] == "E=4,N=14336,device_name=NVIDIA_H200.json" and rep["ep"] == 2
    assert code == cycle.UNCONFIRMED and rep["price_current"]["ms"] > 0
    assert rep["expected_gain"] == pytest.approx(1.2, rel=0.03)
    assert "TP 1 EP 2" in (tmp_path / "report" / cycle.REPORT_MD).read_text()
    rc = cli.main(["cycle", "--model", "mixtral-8x7b", "--engine", "vllm", "--current", str(cur), "--ep", "2",
                   "--traffic", str(traffic[0]), "--no-mlflow", "--report-dir", str(tmp_path / "r2")])
    err = capsys.readouterr().err
    assert rc == 2 and "no recorded vllm_fused_moe times for E=4, N=14336" in err  # found; the packaged rows lack it


def test_a_no_change_cycle_stores_its_profile_in_the_report_folder(tmp_path):
    """A "no change" cycle writes nothing into --current, so its profile was lost and the next cycle again had none
    (everything moved, drift never detected); now the report folder keeps it for the same engine file."""
    cur = current_folder(tmp_path)
    live = {p.name: p.read_text() for p in cur.iterdir()}
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 0.0)]
    code, rep = cycle_on(cur, traffic, tmp_path)
    assert code == cycle.NO_CHANGE and rep["profile_before"] is None and rep["moved_keys"] >= 3
    assert (tmp_path / "report" / cycle.REPORT_PROFILE_FILE).exists()
    code, rep = cycle_on(cur, traffic, tmp_path)
    assert code == cycle.NO_CHANGE and rep["profile_before"] is not None and rep["moved_keys"] == 0
    assert "report folder" in rep["profile_before_source"]
    assert all(k["why"] in ("unchanged", "no traffic") for k in rep["keys"])
    assert "stored profile: yes, the report folder's" in (tmp_path / "report" / cycle.REPORT_MD).read_text()
    assert {p.name: p.read_text() for p in cur.iterdir()} == live  # --current is never written
    code, rep = cycle_on(cur, [traffic[0], experts(tmp_path, 1.2)], tmp_path)  # a proposal, not put in place
    assert code == cycle.UNCONFIRMED and rep["profile_before"] is not None
    code, rep = cycle_on(cur, [traffic[0], experts(tmp_path, 1.2)], tmp_path)
    assert code == cycle.UNCONFIRMED and rep["profile_before"] is None  # its profile is not the live file's


def test_drift_below_the_thresholds_each_period_still_adds_up(tmp_path):
    """Each no-change cycle stored its own profile as the next baseline, so a skew rising 0.1 a period never moved
    a key (review of session 62); the baseline now stays until a key moves."""
    cur = current_folder(tmp_path)
    steps = [scrape(tmp_path, STEPS)]
    codes = [cycle_on(cur, [*steps, experts(tmp_path, round(0.1 * i, 1))], tmp_path)[0] for i in range(0, 13)]
    assert codes[0] == cycle.NO_CHANGE and cycle.UNCONFIRMED in codes  # the drift is seen before skew 1.2


def test_a_report_folder_that_is_the_current_folder_does_not_pass_a_proposal_off_as_live(tmp_path):
    """With --report-dir equal to --current, a proposal's profile landed as the current folder's
    traffic_profile.json and the next cycle took it as the live files' baseline."""
    cur = current_folder(tmp_path)
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)]
    code, _ = cycle_on(cur, traffic, tmp_path, report_dir=cur)
    assert code == cycle.UNCONFIRMED and not (cur / metrics.PROFILE_FILE).exists()
    code, rep = cycle_on(cur, traffic, tmp_path, report_dir=cur, out=tmp_path / "again")
    assert code == cycle.UNCONFIRMED and rep["profile_before"] is None


def test_the_engine_release_comes_from_the_sidecar_or_the_flag_and_is_reported(tmp_path, capsys):
    d = tmp_path / "moe"
    ee.write_engine_file(d, "vllm", SHAPE, DEV, {str(k): to_entry(A) for k in KEYS}, "3.6.0",
                         {"skew": 0.0, "engine": "vllm-0.33.0"})
    traffic = [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)]
    _, rep = cycle_on(d, traffic, tmp_path)
    assert (rep["engine_version"], rep["engine_version_source"]) == ("0.33.0", ee.SIDECAR)
    _, rep = cycle_on(d, traffic, tmp_path, engine_version="v0.34.0")
    assert rep["engine_version"] == "0.34.0" and "exported for vllm-0.33.0" in rep["engine_version_source"]
    assert any("exported for vllm-0.33.0" in line for line in cycle.summary_lines(11, rep, tmp_path))
    assert "vllm 0.34.0" in (tmp_path / "report" / cycle.REPORT_MD).read_text()
    with pytest.raises(ValueError, match="no tables of vllm-0.1.0.*scripts/extract_engine_tables.py"):
        cycle_on(d, traffic, tmp_path, engine_version="0.1.0")
    with pytest.raises(ValueError, match="names sglang, but the engine is vllm"):
        cycle_on(d, traffic, tmp_path, engine_version="sglang-0.5.23")
    from kernel_gym.cli.cycle import build_parser

    assert build_parser().parse_args(["--current", str(d), "--engine-version", "0.34.0"]).engine_version == "0.34.0"


def test_a_sidecar_of_another_engine_is_named(tmp_path):
    d = tmp_path / "moe"
    ee.write_engine_file(d, "vllm", SHAPE, DEV, {str(k): to_entry(A) for k in KEYS}, "3.6.0",
                         {"skew": 0.0, "engine": "sglang-0.5.23"})
    with pytest.raises(ValueError, match="exported for sglang-0.5.23: pass --engine sglang"):
        cycle_on(d, [scrape(tmp_path, STEPS)], tmp_path)
    with pytest.raises(ValueError, match="exported for sglang-0.5.23: pass --engine sglang"):
        cycle_on(d, [scrape(tmp_path, STEPS)], tmp_path, engine_version="0.34.0")


def test_the_release_named_is_the_one_the_rows_are_read_for(tmp_path, monkeypatch):
    """The release picks the launch path priced at each M: the Pricer must get it, not the bare engine name."""
    d = current_folder(tmp_path)
    seen = []
    real = cycle.Pricer

    def spy(shape, device, rows, engine, **kw):
        seen.append(engine)
        return real(shape, device, rows, engine, **kw)

    monkeypatch.setattr(cycle, "Pricer", spy)
    cycle_on(d, [scrape(tmp_path, STEPS), experts(tmp_path, 1.2)], tmp_path, engine_version="0.33.0")
    assert seen == ["vllm-0.33.0"]
