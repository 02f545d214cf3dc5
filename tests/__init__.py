"""The test suite (a package, so tests/trainer is `tests.trainer`, never the `trainer` package it tests)."""
