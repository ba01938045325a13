"""Helpers of ``bench/run.py``: processes, wrk load, scenarios, the EVM fixture, the report."""
