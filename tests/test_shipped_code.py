"""The contract code chaingate ships is the pinned npm artifact's, byte for byte."""

from __future__ import annotations

from chaingate.bundler.simulation import simulations_code_v07
from chaingate.devnet import shipped
from chaingate.devnet.artifacts import aa_artifacts


def test_shipped_entry_point_simulations_is_the_pinned_npm_artifact() -> None:
    assert shipped.main([]) == 0
    artifact = aa_artifacts({"sim": ("v07", "EntryPointSimulations")}, announce=lambda _: None)
    assert simulations_code_v07() == artifact["sim"].deployed_bytecode
