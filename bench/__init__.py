"""Benchmark scripts, one folder per question (bench/README.md maps each to what it answers
and writes); ``common.py`` holds what several share."""
