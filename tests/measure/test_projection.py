"""collect's projected time: set from the committed runs' own pace, not a roofline that read them 4-40x short."""

from kernel_gym.measure import collect
from kernel_gym.measure.collect import CollectOptions, PlanItem, committed_logs, estimate_seconds, fit_projection


def test_the_projection_constants_are_the_committed_runs_fit():
    """SECONDS_PER_CONFIG and its range are what fit_projection gives on the logs under benchmarks/; a new committed
    run that moves them fails here until the constants are refitted."""
    fit = fit_projection(committed_logs())
    assert len(fit["runs"]) >= 10 and all("H200" in r["device"] for r in fit["runs"])
    assert round(fit["median"], 3) == collect.SECONDS_PER_CONFIG
    assert tuple(round(x, 3) for x in fit["range"]) == tuple(round(x, 3) for x in collect.SECONDS_PER_CONFIG_RANGE)


def test_fit_reads_finished_runs_only(tmp_path):
    done, cut, small, h100 = (tmp_path / f"{n}.log" for n in "abcd")
    line = ("[collect] device NVIDIA {d} x{g}, compile pool 30; plan: 9 workloads, {n} configs; already stored 0; "
            "to measure {n}\n")
    done.write_text(line.format(d="H200", g=2, n=1000) + "[collect] wrote 1000 rows in 1m00s; store holds 1000 rows\n")
    cut.write_text(line.format(d="H200", g=1, n=1000) + "[collect] wrote 400 rows in 1m00s\n")
    small.write_text(line.format(d="H200", g=1, n=60) + "[collect] wrote 60 rows in 0m31s\n")
    h100.write_text(line.format(d="H100 80GB HBM3", g=1, n=1000) + "[collect] wrote 1000 rows in 1m40s\n")
    fit = fit_projection([done, cut, small, h100])
    assert [r["log"] for r in fit["runs"]] == [str(done)] and fit["median"] == 60 * 2 / 1000


def test_a_tune_sized_plan_projects_near_its_measured_minute():
    """tune on MiniMax-Text-01 TP 8 measured 1,002 configs on one H200 in 60 s; the roofline said 4 s."""
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.models import load_model

    w = next(iter(model_workloads("fused_moe", load_model("minimax-text-01@tp8")))).key()
    plan = [[PlanItem("fused_moe", w, tuple(f"c{i}" for i in range(1002)), "grid")]]
    est = estimate_seconds(plan, CollectOptions(), 1)
    lo, hi = est["projected_range_s"]
    assert lo <= 60 <= hi and 30 <= est["projected_s"] <= 90 and est["gpu_s"] < 10


def test_a_dry_run_leaves_out_what_the_store_holds_from_the_gpu_that_measured_most_of_it(tmp_path):
    """A dry run has no GPU to name its context: it takes the stored context (device, torch, triton) that holds the
    most of the plan, as a rerun on that machine with the same --db would skip it."""
    import json

    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.measure.store import Context, MeasurementStore
    from kernel_gym.measure.types import OK, Measurement
    from kernel_gym.measure.worker import family_store_key, resolve_family
    from kernel_gym.models import load_model

    fam = resolve_family("fused_moe")
    wl = next(iter(model_workloads("fused_moe", load_model("mixtral-8x7b"))))
    w, cfgs = wl.key(), [str(c) for c in fam.space.valid_configs(wl)][:40]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"kernel": "fused_moe", "workload": w, "configs": cfgs}]))
    db = tmp_path / "m.sqlite"
    opts = CollectOptions(kernels=["fused_moe"], plan_file=str(plan), db=str(db))
    before = collect.dry_run(opts)  # no store yet: everything is to measure
    assert before["already_stored"] == 0 and before["to_measure"] == 40

    def put(device: str, triton: str, n: int) -> None:
        ctx = Context(device, "2.11.0", triton, fam.name, family_store_key(fam))
        with MeasurementStore(db) as s:
            s.put_many(ctx, [Measurement(fam.name, w, c, OK, median_ms=0.1, spread=0.01, repeats=3)
                             for c in cfgs[:n]])

    put("NVIDIA H200", "3.6.0", 30)
    put("NVIDIA H100 80GB HBM3", "3.6.0", 10)
    est = collect.dry_run(opts)
    assert est["already_stored"] == 30 and est["to_measure"] == 10 and est["configs"] == 40
    assert est["stored_on"] == {"fused_moe": "NVIDIA H200, torch 2.11.0, triton 3.6.0"}
    assert est["projected_s"] < before["projected_s"] / 3
    put("cpu-interpreter", "3.9.0", 40)  # the interpreter's rows resume an interpreter run only
    assert collect.dry_run(opts)["already_stored"] == 30
    cpu = collect.dry_run(CollectOptions(kernels=["fused_moe"], plan_file=str(plan), db=str(db), device="cpu"))
    assert cpu["already_stored"] == 40 and cpu["stored_on"]["fused_moe"].startswith("cpu-interpreter")
