"""scripts/check_readme_figures.py: every checked figure's text is where the script looks for it (once), the GPU
figures equal their committed JSON, and a figure that moved or whose text vanished fails with its own exit code."""

from __future__ import annotations

from tests.script_module import load_script

figs = load_script("check_readme_figures")


def test_every_figure_text_is_found_once_in_its_file() -> None:
    for fig in figs.FIGURES:
        figs.printed(fig)  # LookupError names the figure and the file when its text moved


def test_gpu_figures_equal_their_committed_json() -> None:
    rows, rc = figs.check([f for f in figs.FIGURES if f.tier == "gpu"])
    assert rc == 0, [r for r in rows if not r["ok"]]
    assert rows and all(r["ok"] for r in rows)


def test_a_moved_figure_or_a_vanished_text_fails(tmp_path, monkeypatch) -> None:
    (tmp_path / "README.md").write_text("the dataset holds 1,234 rows\n")
    monkeypatch.setattr(figs, "ROOT", tmp_path)
    same = figs.Figure("rows", "README.md", rf"holds {figs.N} rows", "test", lambda: 1234.0)
    moved = figs.Figure("rows", "README.md", rf"holds {figs.N} rows", "test", lambda: 1240.0, tolerance=5.0)
    gone = figs.Figure("rows", "README.md", rf"keeps {figs.N} rows", "test", lambda: 1234.0)
    assert figs.check([same]) == ([{"figure": "rows", "file": "README.md", "printed": 1234.0, "actual": 1234.0,
                                    "tolerance": 0.0, "source": "test", "tier": "ci", "ok": True}], 0)
    rows, rc = figs.check([moved])
    assert rc == 1 and rows[0]["ok"] is False and rows[0]["actual"] == 1240.0
    rows, rc = figs.check([gone])
    assert rc == 2 and "occurs 0 times" in rows[0]["error"]
    assert figs.main(["--list"]) == 0
