"""The contract code chaingate ships is what the pinned npm packages make, byte for byte: v0.7's
and v0.8's EntryPointSimulations as published, v0.6's EntryPoint as patched and compiled by the
pinned solc (chaingate.devnet.shipped)."""

from __future__ import annotations

import json

from chaingate.bundler.simulation import simulations_code_v07, simulations_for
from chaingate.devnet import shipped
from chaingate.devnet.artifacts import aa_artifacts, aa_package
from chaingate.simulation.userops import simulation_code


def test_shipped_entry_point_simulations_are_what_the_pinned_packages_make() -> None:
    assert shipped.main([]) == 0
    artifact = aa_artifacts({"sim": ("v07", "EntryPointSimulations")}, announce=lambda _: None)
    assert simulations_code_v07() == artifact["sim"].deployed_bytecode
    assert simulation_code("0.7") == simulations_code_v07()
    assert simulation_code("0.8") == simulations_for("0.8")
    v06 = json.loads(shipped.expected_v06())
    assert simulation_code("0.6").hex() == v06["deployedBytecode"][2:]


def test_the_v06_patch_changes_what_it_says_and_nothing_else() -> None:
    """simulateHandleOp returns instead of reverting, the SenderCreator is computed; the rest
    of the source is aa 0.6.0's."""
    patched = shipped.patched_v06_sources()["@account-abstraction/contracts/core/EntryPoint.sol"]
    assert "revert ExecutionResult(" not in patched
    assert "assembly { return(add(result, 32), mload(result)) }" in patched
    assert "SenderCreator private immutable senderCreator" not in patched
    assert patched.count("senderCreator().createSender") == 2
    original = (aa_package("v06", announce=lambda _: None) / "core/EntryPoint.sol").read_text()
    kept = [line for line in original.splitlines() if "senderCreator" not in line]
    kept = [line for line in kept if "revert ExecutionResult(" not in line]
    assert all(line in patched for line in kept)
