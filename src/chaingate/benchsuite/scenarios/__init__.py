"""Workloads on locust: each module gives ``scenario(plan, recorder)`` (imports locust)."""
