"""collect's projected time: set from the committed runs' own pace, not a roofline that read them 4-40x short."""

from kernel_gym.measure import collect
from kernel_gym.measure.collect import CollectOptions, PlanItem, committed_logs, estimate_seconds, fit_projection


def test_the_projection_constants_are_the_committed_runs_fit():
    """WORKER_S_PER_CONFIG and its range are what fit_projection gives on the logs under benchmarks/; a new committed
    run that moves them fails here until the constants are refitted."""
    fit = fit_projection(committed_logs())
    assert len(fit["runs"]) >= 10
    assert round(fit["median"], 2) == collect.WORKER_S_PER_CONFIG
    assert tuple(round(x, 2) for x in fit["range"]) == collect.WORKER_S_PER_CONFIG_RANGE


def test_fit_reads_finished_runs_only(tmp_path):
    done, cut, small = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "c.log"
    line = ("[collect] device NVIDIA H200 x1, compile pool {p}; plan: 9 workloads, {n} configs; already stored 0; "
            "to measure {n}\n")
    done.write_text(line.format(p=15, n=1000) + "[collect] wrote 1000 rows in 1m00s; store holds 1000 rows\n")
    cut.write_text(line.format(p=15, n=1000) + "[collect] wrote 400 rows in 1m00s\n")
    small.write_text(line.format(p=15, n=60) + "[collect] wrote 60 rows in 0m31s\n")
    fit = fit_projection([done, cut, small])
    assert [r["log"] for r in fit["runs"]] == [str(done)] and fit["median"] == 60 * 15 / 1000


def test_a_tune_sized_plan_projects_near_its_measured_minute():
    """tune on MiniMax-Text-01 TP 8 measured 1,002 configs with 15 compile workers in 60 s; the roofline said 4 s."""
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.models import load_model

    w = next(iter(model_workloads("fused_moe", load_model("minimax-text-01@tp8")))).key()
    plan = [[PlanItem("fused_moe", w, tuple(f"c{i}" for i in range(1002)), "grid")]]
    est = estimate_seconds(plan, CollectOptions(), 1, 15)
    lo, hi = est["projected_range_s"]
    assert lo <= 60 <= hi and 30 <= est["projected_s"] <= 90 and est["gpu_s"] < 10
