"""The documentation site's generated references and its snippet runner.

``python -m tests.docsgen`` writes every reference page under ``docs/reference/`` (``pages``
says which generator makes which page); ``tests/test_docs_reference.py`` regenerates them and
fails on a difference.  ``tests/test_docs_snippets.py`` runs every snippet of the site against
a ``chaingate dev`` (``snippets``) and checks that the server publishes what the REST and
metrics pages say.
"""
