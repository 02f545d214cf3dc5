"""Tests of trainer/job/ (the folder of the same name)."""
