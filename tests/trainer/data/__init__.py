"""Tests of trainer/data/ (the folder of the same name)."""
