"""Stores, snapshots, traces and specs checked as data (issue 25 item 5): every reader refuses the audit's crafted
rows in one line naming the file and row, merge checks each source like `data` and never writes into a foreign
database, and a refused row can be dropped."""

from __future__ import annotations

import gzip
import hashlib
import json
import sqlite3
from dataclasses import asdict
from pathlib import Path

import pytest

from kernel_gym.cli import main
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.store import Context, MeasurementStore, load_rows, roofline_floor_ms
from kernel_gym.measure.storetools import merge_stores
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.models import load_model

CTX = Context("NVIDIA H200", "2.11", "3.6", "fused_moe", "h1")
MIXTRAL_256 = MoEWorkload(256, 8, 2, 4096, 14336).key()
CFG = '{"BLOCK_M":64}'


def one_line(rc: int, err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def store_with(path: Path, *rows: Measurement) -> Path:
    with MeasurementStore(path) as s:
        s.put_many(CTX, list(rows))
    return path


def good(ms: float = 1.0, wl: str = MIXTRAL_256, cfg: str = CFG) -> Measurement:
    return Measurement("fused_moe", wl, cfg, OK, median_ms=ms, spread=0.01, repeats=3)


def test_the_roofline_floor_is_below_every_real_time_and_above_the_audits_row():
    floor = roofline_floor_ms("fused_moe", MIXTRAL_256)
    assert 0.01 < floor < 0.5  # the audit's 0.01 ms row is refused; Mixtral M=256 runs in ~0.6 ms or more


@pytest.mark.parametrize("bad, needle", [
    (good(0.01), "below 0.5 x the workload's roofline bound"),
    (good(1e-9), "not a plausible kernel time"),
    (good(1.0, wl="not json"), "workload 'not json' is not a JSON object"),
    (Measurement("fused_moe", MIXTRAL_256, CFG, "0.5", median_ms=None), "status '0.5' is not one of"),
    (good(1.0, cfg=MIXTRAL_256 + "x"), "config"),
])
def test_merge_checks_every_source_row_like_data_and_writes_nothing(tmp_path, capsys, bad, needle):
    src = store_with(tmp_path / "src.sqlite", good(2.0, cfg='{"BLOCK_M":16}'), bad)
    into = tmp_path / "into.sqlite"
    rc = main(["data", "--merge", str(src), "--into", str(into)])
    one_line(rc, capsys.readouterr().err, str(src), needle)
    assert not into.exists()  # checked before anything is written


def test_merge_refuses_a_foreign_sqlite_target_and_leaves_it_untouched(tmp_path, capsys):
    mlflow_db = tmp_path / "mlflow.db"
    with sqlite3.connect(mlflow_db) as con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO experiments VALUES (0, 'Default')")
    before = hashlib.sha256(mlflow_db.read_bytes()).hexdigest()
    src = store_with(tmp_path / "src.sqlite", good())
    rc = main(["data", "--merge", str(src), "--into", str(mlflow_db)])
    one_line(rc, capsys.readouterr().err, str(mlflow_db), "not a kernel_gym measurement store")
    assert hashlib.sha256(mlflow_db.read_bytes()).hexdigest() == before


def test_a_good_merge_still_works(tmp_path):
    a = store_with(tmp_path / "a.sqlite", good(1.0))
    b = store_with(tmp_path / "b.sqlite", good(1.1, cfg='{"BLOCK_M":16}'))
    rep = merge_stores([a, b], tmp_path / "m.sqlite")
    assert rep["rows"] == 2 and rep["integrity"] == "ok"


def test_an_implausible_row_is_refused_by_readers_and_can_be_dropped(tmp_path, capsys):
    db = store_with(tmp_path / "s.sqlite", good(1.0, cfg='{"BLOCK_M":16}'), good(0.01))
    with pytest.raises(ValueError, match=r"row id 2 .* --drop-row 2\)") as info:
        load_rows(db)
    assert "\n" not in str(info.value)
    assert main(["data", "--db", str(db), "--drop-row", "2"]) == 0
    assert "1 of 1 rows dropped" in capsys.readouterr().out
    (ctx, ms), = load_rows(db)
    assert [m.median_ms for m in ms] == [1.0]


def test_drop_row_refuses_a_foreign_database(tmp_path, capsys):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    one_line(main(["data", "--db", str(other), "--drop-row", "1"]), capsys.readouterr().err,
             "not a kernel_gym measurement store")


def test_a_snapshot_with_a_key_twice_is_refused(tmp_path):
    db = store_with(tmp_path / "s.sqlite", good(1.0), good(2.0, cfg='{"BLOCK_M":16}'))
    snap = tmp_path / "s.jsonl.gz"
    with MeasurementStore(db) as s:
        s.export_snapshot(snap)
    lines = gzip.open(snap, "rt").read().splitlines()
    lines.append(lines[-1].replace("2.0", "3.0"))  # the same key again, another time
    with gzip.open(snap, "wt") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"line {len(lines)} repeats the key of line {len(lines) - 1}"):
        load_rows(snap)


# ---- specs -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, needle", [
    ("num_experts", 10**9, "num_experts=1000000000 is beyond any real model"),
    ("top_k", True, "top_k must be a positive integer, got True"),
    ("dtype_bytes", 3, "dtype_bytes must be 1, 2 or 4"),
    ("hidden", "4096", "hidden must be a positive integer, got '4096'"),
    ("attention", "mla", "needs kv_lora_rank"),
])
def test_absurd_specs_fail_in_one_line_before_any_grid_is_built(tmp_path, capsys, field, value, needle):
    spec = {**asdict(load_model("mixtral-8x7b")), "name": "crafted", field: value}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    one_line(main(["collect", "--model", str(path), "--dry-run"]), capsys.readouterr().err, needle)


def test_shared_experts_and_latent_attention_are_recorded_and_counted():
    base = asdict(load_model("mixtral-8x7b"))
    from kernel_gym.models import spec_from_dict

    shared = spec_from_dict({**base, "num_shared_experts": 2, "shared_intermediate": 1024})
    assert shared.weight_bytes > load_model("mixtral-8x7b").weight_bytes
    mla = spec_from_dict({**base, "attention": "mla", "kv_lora_rank": 512, "rope_head_dim": 64})
    assert mla.kv_bytes_per_token == 32 * (512 + 64) * 2 < load_model("mixtral-8x7b").kv_bytes_per_token


# ---- traces ----------------------------------------------------------------------------------------------------------


def test_a_year_9999_timestamp_is_refused(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"
                    "9999-11-16 18:15:46.6805900,10,5\n")
    rc = main(["replay", "--trace", str(path), "--policies", "default", "--json", str(tmp_path / "r.json"),
               "--no-mlflow"])
    one_line(rc, capsys.readouterr().err, f"{path}:3", "9999-11-16")


def test_a_trace_spanning_centuries_is_refused(tmp_path):
    from kernel_gym.traffic.traces import load_burstgpt

    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "0,ChatGPT,10,5,15,Conversation log\n5e10,ChatGPT,10,5,15,Conversation log\n")
    with pytest.raises(ValueError, match=f"{path}:3: .* days after the first request"):
        load_burstgpt(path)


def test_mooncake_token_counts_given_as_strings_are_refused(tmp_path):
    from kernel_gym.traffic.traces import load_mooncake

    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                    '{"timestamp": 5, "input_length": "12", "output_length": 5}\n')
    with pytest.raises(ValueError, match=f"{path}:2: input_length '12' is not a JSON number"):
        load_mooncake(path)
