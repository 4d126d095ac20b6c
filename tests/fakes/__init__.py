"""Test doubles shared across test folders: `AnalyticBackend` (a made-up cost model over the real knob spaces) and
`fresh_store` (a migrated MLflow sqlite store per test)."""
