"""The measurement farm on a local Ray cluster with two fake GPUs (ray.init(num_gpus=2, num_cpus=2)), kernels under
the Triton interpreter: plan split over the actors, dynamic scheduling, an actor killed mid-chunk, the driver killed and
resumed, duplicate suppression, and the farm's store equal to a single-process collection of the same plan.

One cluster serves the whole module (Ray takes seconds to start); skipped when ray is not installed
(`pip install 'kernel_gym[ray]'`, which scripts/setup.sh does).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the farm needs ray: pip install 'kernel_gym[ray]'")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster for the module (scripts/test.sh runs --dist loadgroup)

from kernel_gym.measure.collect import CollectOptions, collect  # noqa: E402
from kernel_gym.measure.farm import FarmOptions, collect_farm, release_kept_actors  # noqa: E402
from kernel_gym.measure.store import MeasurementStore  # noqa: E402
from kernel_gym.measure.storetools import compare_stores  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
KEY = "device, torch_version, triton_version, kernel, source_hash, workload, config"


@pytest.fixture(scope="module")
def cluster():
    """A local cluster with 2 CPUs and 2 fake GPUs; the actors find the test families through PYTHONPATH."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "TRITON_INTERPRET")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["TRITON_INTERPRET"] = "1"
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
             logging_level="ERROR", log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        release_kept_actors()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _opts(db: Path, kernel: str, **kw) -> CollectOptions:
    return CollectOptions(models=["mixtral-8x7b"], kernels=[kernel], grids=["eval", "default"],
                          configs_per_shape=1000, db=str(db), device="cpu", compile_workers=0, **kw)


def _rows(db: Path) -> dict[tuple, dict]:
    with MeasurementStore(db) as s:
        return {tuple(r[k] for k in KEY.split(", ")): r for r in s.rows(origin=True)}


def _no_duplicates(db: Path) -> None:
    con = sqlite3.connect(db)
    try:
        dup = con.execute(f"SELECT COUNT(*) FROM (SELECT {KEY} FROM measurements GROUP BY {KEY} "
                          "HAVING COUNT(*) > 1)").fetchone()[0]
    finally:
        con.close()
    assert dup == 0


def _plan_size(fam) -> int:
    return sum(len(fam.space.valid_configs(w)) for g in ("eval", "default") for w in fam.plan_workloads(None, g))


def test_farm_store_equals_a_single_process_collection(cluster, tmp_path: Path, monkeypatch) -> None:
    """Same plan, plain collect vs the farm: the same rows and statuses; the plan was split over both GPUs, each row
    names its host and GPU; a rerun finds everything stored and measures nothing."""
    from kernel_gym.measure import collect as collect_module

    monkeypatch.setattr(collect_module, "die_with_parent", lambda: None)  # the plain shard runs in this process
    plain, farmed = tmp_path / "plain.sqlite", tmp_path / "farm.sqlite"
    collect(_opts(plain, "tiny_family:FAMILY"), log=open(os.devnull, "w"))
    res = collect_farm(_opts(farmed, "tiny_family:FAMILY"), FarmOptions(keep_actors=True))
    a, b = _rows(plain), _rows(farmed)
    assert {k: r["status"] for k, r in a.items()} == {k: r["status"] for k, r in b.items()}
    assert res["written"] == len(b) == res["planned"] and res["shard_exit_codes"] == [0, 0]
    assert sorted(x["gpu"] for x in res["actors"]) == ["0", "1"]
    assert all(x["chunks"] >= 1 for x in res["actors"]), res["actors"]  # the plan was split
    assert {r["gpu"] for r in b.values()} == {"0", "1"} and all(r["host"] for r in b.values())
    assert {r["gpu"] for r in a.values()} == {""} and all(r["host"] for r in a.values())  # plain: host, no GPU index
    cmp = compare_stores(plain, farmed)
    assert cmp["ok"] and cmp["common"] == len(a), cmp
    again = collect_farm(_opts(farmed, "tiny_family:FAMILY"), FarmOptions(keep_actors=True))
    assert again["written"] == 0 and again["already_stored"] == again["planned"] == len(b)


def test_a_slow_chunk_does_not_hold_up_the_others(cluster, tmp_path: Path) -> None:
    """One workload takes seconds a config, six are fast. The slow chunk goes first (longest first); the other GPU
    takes every fast chunk meanwhile, including the one reserved for the slow actor (stolen), so all fast rows are
    stored before the slow chunk ends."""
    from farm_family import SLOW_N

    db = tmp_path / "slow.sqlite"
    res = collect_farm(_opts(db, "farm_family:SLOW"), FarmOptions(lookahead=1, keep_actors=True))
    rows = list(_rows(db).values())
    slow = [r for r in rows if f'"n":{SLOW_N}' in r["workload"]]
    fast = [r for r in rows if r not in slow]
    assert len(slow) == 5 and len(fast) == 18 and res["written"] == 23
    slow_gpu = {r["gpu"] for r in slow}
    assert len(slow_gpu) == 1
    assert {r["gpu"] for r in fast} == {"0", "1"} - slow_gpu, "a fast chunk waited behind the slow one"
    assert max(r["created"] for r in fast) < min(r["created"] for r in slow)


def test_an_actor_killed_mid_chunk_loses_nothing_and_duplicates_nothing(cluster, tmp_path: Path) -> None:
    """SIGKILL one actor process while it measures a chunk: the chunk goes back to the queue, Ray restarts the actor,
    and the store ends with the whole plan exactly once, all ok (nothing stored as crash)."""
    from farm_family import SLOWPAD

    db = tmp_path / "kill.sqlite"
    killed: dict = {}

    def hook(farm) -> None:
        if killed or farm.written == 0:
            return
        for slot in farm.slots:
            if slot.running is not None:
                killed["pid"], killed["chunk"] = slot.info["pid"], slot.running
                os.kill(slot.info["pid"], signal.SIGKILL)
                return

    res = collect_farm(_opts(db, "farm_family:SLOWPAD"), FarmOptions(keep_actors=True), hook=hook)
    assert killed, "no chunk was in flight to kill"
    assert res["actor_failures"] >= 1 and res["requeued"] >= 1, res
    with MeasurementStore(db) as s:
        assert s.count() == _plan_size(SLOWPAD) == res["written"]
        assert s.count(status="ok") == s.count()
        assert s.integrity_check() == "ok"
        stored = {(r["workload"], r["config"]) for r in s.rows()}
    assert {(killed["chunk"].workload_key, c) for c in killed["chunk"].configs} <= stored
    _no_duplicates(db)


def test_farm_resumes_a_partial_store_without_duplicates(cluster, tmp_path: Path) -> None:
    """Rows a plain collection stored already are skipped (collect.drop_done); the farm measures exactly the rest."""
    from tiny_family import TinyWorkload

    from kernel_gym.measure.collect import contexts_for
    from kernel_gym.measure.types import OK, Measurement

    db = tmp_path / "part.sqlite"
    ctx = contexts_for(["tiny_family:FAMILY"], "cpu-interpreter")["tiny_family:FAMILY"]
    pre = [Measurement("tiny_scale", TinyWorkload(n).key(), '{"BLOCK":16}', OK, source="interpreter")
           for n in (40, 100, 333)]
    with MeasurementStore(db) as s:
        assert s.put_many(ctx, pre, origin=("elsewhere", "7")) == 3
    res = collect_farm(_opts(db, "tiny_family:FAMILY"), FarmOptions(keep_actors=True))
    assert res["already_stored"] == 3 and res["written"] == res["planned"] - 3
    rows = _rows(db)
    assert len(rows) == res["planned"]
    assert sum(r["host"] == "elsewhere" for r in rows.values()) == 3  # the stored rows were kept, not re-measured
    _no_duplicates(db)


def _cli(db: Path, address: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "collect.py"), "--ray", address, "--device", "cpu",
            "--kernels", "farm_family:SLOWPAD", "--model", "mixtral-8x7b", "--grid", "eval,default",
            "--configs-per-shape", "1000", "--db", str(db)]


def test_driver_killed_then_resumed(cluster, tmp_path: Path) -> None:
    """A real driver process (collect --ray ADDRESS, joining the cluster) is SIGKILLed once chunks are stored: the
    store keeps them intact, nothing writes after the kill (its actors die with the job), and a second driver
    completes exactly the rest of the plan."""
    from farm_family import SLOWPAD

    release_kept_actors()  # this test's drivers are other jobs: they need both GPUs
    deadline = time.time() + 30
    while ray.available_resources().get("GPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.2)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    db = tmp_path / "drv.sqlite"
    plan = _plan_size(SLOWPAD)
    proc = subprocess.Popen(_cli(db, cluster), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = 0
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
        if db.exists():
            try:
                con = sqlite3.connect(db, timeout=5)
                seen = con.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                con.close()
            except sqlite3.OperationalError:
                continue
            if seen > 0:
                break
    assert proc.poll() is None, f"the driver ended before it could be killed: {proc.communicate()[1][-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    with MeasurementStore(db) as s:
        after = s.count()
        assert s.integrity_check() == "ok"
    assert 0 < seen <= after < plan, (seen, after, plan)
    time.sleep(1.0)
    with MeasurementStore(db) as s:
        assert s.count() == after, "something kept writing after the driver was killed"
    done = subprocess.run(_cli(db, cluster), env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"already stored {after}" in done.stderr
    with MeasurementStore(db) as s:
        assert s.count() == plan and s.count(status="ok") == plan and s.integrity_check() == "ok"
    _no_duplicates(db)


def test_noise_study_on_every_gpu_writes_replicas(cluster, tmp_path: Path) -> None:
    """collect --ray --noise: the subset is measured on both GPUs, each repeat in a fresh worker, into the replicas
    table (under the interpreter the rows carry no time, so the cross-GPU report has nothing to rank)."""
    from tiny_family import TinyWorkload

    from kernel_gym.measure.collect import contexts_for
    from kernel_gym.measure.farm import farm_noise_study
    from kernel_gym.measure.storetools import replica_rows
    from kernel_gym.measure.types import OK, Measurement

    db = tmp_path / "noise.sqlite"
    ctx = contexts_for(["tiny_family:FAMILY"], "cpu-interpreter")["tiny_family:FAMILY"]
    with MeasurementStore(db) as s:
        s.put_many(ctx, [Measurement("tiny_scale", TinyWorkload(n).key(), f'{{"BLOCK":{b}}}', OK, median_ms=0.01 * b,
                                     spread=0.01, repeats=3) for n in (100, 333) for b in (16, 32, 64)])
    res = farm_noise_study(_opts(db, "tiny_family:FAMILY"), 2, FarmOptions(keep_actors=True),
                           configs_per_workload=2)
    assert res["workloads"] == 2 and sorted(res["gpus"]) == sorted({g for g in res["within_gpu"]})
    with MeasurementStore(db) as s:
        reps = list(replica_rows(s.conn))
    assert len(reps) == 2 * 2 * 4  # GPUs x repeats x (2 workloads x 2 configs)
    assert {r["gpu"] for r in reps} == {"0", "1"} and len({r["run"] for r in reps}) == 2
    assert {r["config"] for r in reps} == {'{"BLOCK":16}', '{"BLOCK":32}'}  # the fastest stored configs
    assert res["across_gpus"]["keys_on_several_gpus"] == 0


def test_budget_stops_between_chunks_and_a_rerun_completes(cluster, tmp_path: Path) -> None:
    """--budget-s: no chunk starts after the deadline (the ones in flight finish and are stored); the rerun measures
    the rest."""
    from farm_family import SLOWPAD

    db = tmp_path / "budget.sqlite"
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    warm = collect_farm(_opts(db, "farm_family:SLOWPAD", plan_file=str(empty)), FarmOptions(keep_actors=True))
    assert warm["planned"] == 0  # the actors are up: the short budget below is spent measuring
    first = collect_farm(_opts(db, "farm_family:SLOWPAD", budget_s=0.5), FarmOptions(keep_actors=True))
    assert first["stopped_by_budget"] and 0 < first["written"] < _plan_size(SLOWPAD), first
    assert first["shard_exit_codes"] == [0, 0]
    rest = collect_farm(_opts(db, "farm_family:SLOWPAD"), FarmOptions(keep_actors=True))
    assert rest["already_stored"] == first["written"] and rest["written"] == _plan_size(SLOWPAD) - first["written"]
    _no_duplicates(db)
