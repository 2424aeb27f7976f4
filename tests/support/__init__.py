"""Test helpers importable by the tests, by spawned scoring workers and by subprocesses."""
