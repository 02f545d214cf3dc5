"""Tests of bench/ modules that are not shipped with the trainer."""
