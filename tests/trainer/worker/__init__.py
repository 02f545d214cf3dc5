"""Tests of trainer/worker/ (the folder of the same name)."""
