"""Gas price estimates: pure fee arithmetic (``prices``) and the per-head oracle (``oracle``)."""
