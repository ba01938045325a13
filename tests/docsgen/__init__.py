"""The documentation site's generated references and its snippet runner.

``python -m tests.docsgen`` writes the references that need no running server under
``docs/reference/``; ``tests/test_docs_reference.py`` regenerates them and fails on a
difference, ``tests/test_docs_snippets.py`` does the same for the ones read from a running
``chaingate dev`` (the OpenAPI document, ``/metrics``) and runs every snippet of the site.
"""
