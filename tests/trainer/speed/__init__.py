"""Tests of trainer/speed/ (the folder of the same name)."""
