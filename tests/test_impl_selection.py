"""The compiled twins load when they should, and CHAINGATE_PURE=1 really forces the pure ones."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chaingate import twins
from tests.conftest import IN_CI


def _selected_in_subprocess(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("CHAINGATE_PURE", None)
    if env_value is not None:
        env["CHAINGATE_PURE"] = env_value
    code = (
        "from chaingate import twins; i = twins.select(); "
        "print(i.name, i.http1.__file__, i.jsonrpc.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_default_selection_is_the_compiled_extension() -> None:
    try:
        compiled = twins.compiled()
    except ImportError:
        if IN_CI:
            pytest.fail("compiled modules are missing under CI: the build step did not run")
        pytest.skip("compiled modules not built")
    for module in (compiled.http1, compiled.jsonrpc):
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__
        assert module.IMPLEMENTATION == "compiled"
    name, http1_file, jsonrpc_file = _selected_in_subprocess(None).split()
    assert name == "compiled"
    assert http1_file.endswith(".so") and jsonrpc_file.endswith(".so")


def test_chaingate_pure_forces_the_python_twins() -> None:
    name, http1_file, jsonrpc_file = _selected_in_subprocess("1").split()
    assert name == "pure"
    assert http1_file.endswith("_pure/http1.py")
    assert jsonrpc_file.endswith("_pure/jsonrpc.py")


def test_every_native_module_has_a_pure_twin_with_the_same_public_api() -> None:
    pure = twins.pure()
    try:
        compiled = twins.compiled()
    except ImportError:
        pytest.skip("compiled modules not built")
    for name in twins.NATIVE_MODULES:
        pure_module = getattr(pure, name)
        compiled_module = getattr(compiled, name)
        assert pure_module.__all__ == compiled_module.__all__, name
        for attribute in pure_module.__all__:
            assert hasattr(pure_module, attribute) and hasattr(compiled_module, attribute), (
                name,
                attribute,
            )
