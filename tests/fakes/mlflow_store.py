"""A fresh MLflow sqlite store per test without paying MLflow's schema migrations (~9 s on CI) each time: the first
call migrates an empty database, later calls copy that file."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

_TEMPLATE: Path | None = None


def fresh_store(directory: Path, name: str = "mlflow.db") -> str:
    """A tracking URI of an empty, migrated sqlite store in `directory`."""
    global _TEMPLATE
    if _TEMPLATE is None:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        path = Path(tempfile.mkdtemp(prefix="kg-mlflow-template-")) / "template.db"
        store = SqlAlchemyStore(f"sqlite:///{path}", (path.parent / "artifacts").as_uri())
        store.engine.dispose()
        _TEMPLATE = path
    target = Path(directory) / name
    shutil.copy(_TEMPLATE, target)
    return f"sqlite:///{target}"
