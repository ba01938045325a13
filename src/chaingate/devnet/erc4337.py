"""ERC-4337 on the devnet: EntryPoint v0.6, v0.7 and v0.8 at their mainnet addresses, their
SimpleAccountFactory, v0.7's and v0.8's EntryPointSimulations, v0.8's Simple7702Account (the
code an EIP-7702 account delegates to) and a funded, staked VerifyingPaymaster each.

The EntryPoints and factories go through the deterministic deployment proxy with the salts
their mainnet deployments used, so the npm bytecode lands at the canonical addresses; each is
checked against the address below before anything is sent (a mismatch is an error, never a
silent deployment elsewhere).  The paymasters carry chaingate's signer, so they cannot be
canonical: they are deployed by the devnet deployer (plain CREATE), which makes it their owner
(``addStake``/``withdrawTo`` are owner-only) — through the proxy nobody could own them.
"""

from __future__ import annotations

from collections.abc import Mapping

from chaingate.config.manifest import Contract, Kind
from chaingate.devnet.artifacts import Artifact
from chaingate.devnet.deploy import Planned, Tx, create2_tx
from chaingate.evm import abi
from chaingate.evm.addresses import same_address

ZERO_SALT = bytes(32)
# The salt eth-infinitism deployed EntryPoint v0.7 with (its deployment info in the repo).
V07_ENTRY_POINT_SALT = bytes.fromhex(
    "90d8084deab30c2a37c45e8d47f49f2f7965183cb6990a98943ef94940681de3"
)
# ...and v0.8's (its SimpleAccountFactory and Simple7702Account used the zero salt).
V08_ENTRY_POINT_SALT = bytes.fromhex(
    "0a59dbff790c23c976a548690c27297883cc66b4c67024f9117b0238995e35e9"
)
ENTRY_POINT_SALTS = {"v06": ZERO_SALT, "v07": V07_ENTRY_POINT_SALT, "v08": V08_ENTRY_POINT_SALT}

CANONICAL = {
    "entry_point_v06": "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789",
    "entry_point_v07": "0x0000000071727De22E5E9d8BAf0edAc6f37da032",
    "simple_account_factory_v06": "0x9406Cc6185a346906296840746125a0E44976454",
    "simple_account_factory_v07": "0x91E60e0613810449d098b0b5Ec8b51A0FE8c8985",
    "entry_point_v08": "0x4337084D9E255Ff0702461CF8895CE9E3b5Ff108",
    "simple_account_factory_v08": "0x13E9ed32155810FDbd067D4522C492D6f68E5944",
    "simple_7702_account_v08": "0xe6Cae83BdE06E4c305530e199D7217f42808555B",
}

# Manifest name -> (package alias tag, artifact name).
ARTIFACTS = {
    "entry_point_v06": ("v06", "EntryPoint"),
    "entry_point_v07": ("v07", "EntryPoint"),
    "entry_point_simulations_v07": ("v07", "EntryPointSimulations"),
    "simple_account_factory_v06": ("v06", "SimpleAccountFactory"),
    "simple_account_factory_v07": ("v07", "SimpleAccountFactory"),
    "verifying_paymaster_v06": ("v06", "VerifyingPaymaster"),
    "verifying_paymaster_v07": ("v07", "VerifyingPaymaster"),
    "entry_point_v08": ("v08", "EntryPoint"),
    "entry_point_simulations_v08": ("v08", "EntryPointSimulations"),
    "simple_account_factory_v08": ("v08", "SimpleAccountFactory"),
    "simple_7702_account_v08": ("v08", "Simple7702Account"),
}
# Manifest name -> contract compiled from chaingate's own contracts/erc4337 sources.
COMPILED = {"verifying_paymaster_v08": "VerifyingPaymasterV08"}

VERSIONS = {"v06": "0.6", "v07": "0.7", "v08": "0.8"}
PAYMASTER_DEPOSIT = 10 * 10**18  # wei in EntryPoint.depositTo: pays for sponsored operations
PAYMASTER_STAKE = 1 * 10**18  # bundlers require paymasters that use storage to be staked
PAYMASTER_UNSTAKE_DELAY = 86_400  # seconds; the common bundler minimum


def deployments(
    artifacts: Mapping[str, Artifact], deployer: str, paymaster_signer: str
) -> list[Planned]:
    planned: list[Planned] = []
    for tag, version in VERSIONS.items():
        entry_point = f"entry_point_{tag}"
        salt = ENTRY_POINT_SALTS[tag]
        planned.append(_create2(entry_point, artifacts, deployer, salt, b"", version, None))
        factory_args = abi.encode(["address"], [CANONICAL[entry_point]])
        # (name, constructor arguments, kind) of what else is deployed at salt 0 for the tag.
        zero_salt: list[tuple[str, bytes, Kind]] = []
        if tag != "v06":
            # Not deployed on mainnet (bundlers use it as a state override): ours.
            zero_salt.append((f"entry_point_simulations_{tag}", b"", "entry_point_simulations"))
        zero_salt.append((f"simple_account_factory_{tag}", factory_args, "account_factory"))
        if tag == "v08":
            zero_salt.append(("simple_7702_account_v08", b"", "account_delegate"))
        for name, args, kind in zero_salt:
            planned.append(
                _create2(
                    name, artifacts, deployer, ZERO_SALT, args, version, entry_point, kind=kind
                )
            )
        name = f"verifying_paymaster_{tag}"
        artifact = artifacts[name]
        init_code = artifact.bytecode + abi.encode(
            ["address", "address"], [CANONICAL[entry_point], paymaster_signer]
        )
        planned.append(
            Planned(
                name,
                Tx(name, deployer, None, init_code, gas=3_000_000),
                None,
                Contract(
                    address="",
                    kind="paymaster",
                    canonical=False,
                    source=artifact.source,
                    block=0,
                    version=version,
                    entry_point=entry_point,
                ),
            )
        )
    return planned


def _create2(
    name: str,
    artifacts: Mapping[str, Artifact],
    deployer: str,
    salt: bytes,
    args: bytes,
    version: str,
    entry_point: str | None,
    *,
    kind: Kind = "entry_point",
) -> Planned:
    artifact = artifacts[name]
    tx, address = create2_tx(name, deployer, salt, artifact.bytecode + args, gas=8_000_000)
    canonical = CANONICAL.get(name)
    if canonical is not None and not same_address(address, canonical):
        raise RuntimeError(
            f"{name}: {artifact.source} bytecode would land at {address}, not at the canonical "
            f"{canonical}; refusing to deploy it elsewhere"
        )
    contract = Contract(
        address="",
        kind=kind,
        canonical=canonical is not None,
        source=artifact.source,
        block=0,
        version=version,
        entry_point=entry_point,
    )
    return Planned(name, tx, address, contract)


def funding(addresses: Mapping[str, str], deployer: str) -> list[Tx]:
    """Deposit and stake for each paymaster (the deployer owns them)."""
    txs = []
    for tag in VERSIONS:
        paymaster = addresses[f"verifying_paymaster_{tag}"]
        txs.append(
            Tx(
                f"depositTo(verifying_paymaster_{tag})",
                deployer,
                addresses[f"entry_point_{tag}"],
                abi.encode_call("depositTo(address)", paymaster),
                value=PAYMASTER_DEPOSIT,
                gas=100_000,
            )
        )
        txs.append(
            Tx(
                f"addStake(verifying_paymaster_{tag})",
                deployer,
                paymaster,
                abi.encode_call("addStake(uint32)", PAYMASTER_UNSTAKE_DELAY),
                value=PAYMASTER_STAKE,
                gas=150_000,
            )
        )
    return txs
