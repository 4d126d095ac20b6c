"""kernel_gym's tests, importable as a package (`pythonpath = ["."]` in pyproject.toml): shared helpers are
imported as `tests.fakes.*` and `tests.script_module`, never through sys.path edits."""
