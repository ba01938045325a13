"""``chaingate bench``: load tests against any endpoint, on locust used as a library.

Only ``engine`` and the ``scenarios`` import locust (which monkey-patches the process with
gevent on import): ``chaingate bench`` runs in a process of its own (``python -m
chaingate.benchsuite``), so ``chaingate serve`` never imports it.  Everything else here —
recording, results, the HTML report, ``compare`` — is plain Python, testable without locust.
"""
