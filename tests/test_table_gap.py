"""benchmarks/live_e2e/table_gap.py: a dispatch table's choices against the fastest config the packaged dataset
measured. A table holding the dataset's own fastest config at every measured cell scores exactly 1; the live runs'
table scores what the committed gap.json says."""

import json
from pathlib import Path

from benchmarks.live_e2e import table_gap
from kernel_gym.dispatch.baselines import Oracle
from kernel_gym.dispatch.dispatcher import DispatchTable
from kernel_gym.measure import make_backend
from kernel_gym.traffic.simulator import KVLayout

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "benchmarks" / "live_replay" / "inputs" / "dispatch_table.json"


def test_the_datasets_own_fastest_configs_score_one_and_the_old_table_its_committed_gap(tmp_path):
    backend = make_backend("recorded")
    oracle = Oracle(backend)
    table = DispatchTable.load(OLD)
    moe = table.kernels["fused_moe"]
    best = []
    for i in range(len(moe.centers[0])):
        for j in range(len(moe.centers[1])):
            w = moe.cell_workload(i, j)
            best.append(oracle.best("fused_moe", w) or moe.configs[moe.cells[i * len(moe.centers[1]) + j]])
    moe.configs = list(dict.fromkeys(best))
    moe.cells = [moe.configs.index(c) for c in best]
    table.kernels = {"fused_moe": moe}
    path = table.save(tmp_path / "oracle.json")
    got = table_gap.table_gap(path, oracle, KVLayout(16, "NHD"))["fused_moe"]
    assert got["geomean"] == 1.0 and got["worst"]["ratio"] == 1.0 and got["untimed_choices"] == 0
    assert got["within_1pct"] == got["measured_cells"] > 50
    committed = json.loads((ROOT / "benchmarks" / "live_e2e" / "tables" / "gap.json").read_text())
    old = table_gap.table_gap(OLD, oracle, KVLayout(16, "NHD"))
    if committed["dataset_sha256_16"] == backend.dataset_hash:  # the gap is the data's: another dataset moves it
        assert old["fused_moe"] == committed["tables"][str(OLD.relative_to(ROOT))]["fused_moe"]
    assert old["fused_moe"]["geomean"] > 1.05 and old["fused_moe"]["skew0_by_tokens"]["4096"] > 1.2
