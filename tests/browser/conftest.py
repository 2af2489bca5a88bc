"""Browser tests share the fixtures of tests/conftest.py (one browser, one Pyodide boot)."""
