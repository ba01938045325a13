"""The compiled boundary, typed: what each hot-path twin module offers its callers.

Every ``native/<name>.pyx`` (``chaingate._native.<name>``) and its pure twin
(``chaingate._pure.<name>``) satisfy the module Protocol of ``twintypes.<name>``; ``twins.py``
hands them out under these types, so mypy checks every caller against one declaration.
``tests/test_compiled_stubs.py`` checks that both twins offer what is declared (names,
parameters, the members of every object they build); mypy also checks the pure http1, jsonrpc
and limiter in ``twins.pure``.  Protocols cost nothing at run time: nothing here is called on
the request path.

The lane declares here what it asks of the code around it — the key gate it calls back
(``AdmissionGate.rejection``, its meters), the principals it reads, the method specs, the
access log, the edge loop it hands answers to — so ``chaingate.auth`` and ``chaingate.rpc``
satisfy interfaces the lane owns, as ``rpc/`` owns its ``Gate``.
"""
