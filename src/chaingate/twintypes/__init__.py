"""The compiled boundary, typed: what each hot-path twin module offers its callers.

Every ``native/<name>.pyx`` (``chaingate._native.<name>``) and its pure twin
(``chaingate._pure.<name>``) satisfy the module Protocol of ``twintypes.<name>``; ``impl.py``
hands them out under these types, so mypy checks every caller against one declaration.  The
pure twins are checked statically (``impl.pure`` assigns them); the compiled modules, which
mypy cannot read, by ``tests/test_compiled_stubs.py`` at run time.  Protocols cost nothing at
run time: nothing here is called on the request path.
"""
