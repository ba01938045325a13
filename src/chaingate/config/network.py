"""``Network``: one configured network, the key of every per-network table.

A network has three spellings: the URL's bytes (``/v1/rpc/ethereum/sepolia``), the text
``ethereum/sepolia`` (labels, logs, metric labels, stored rows) and the REST alias
``ethereum-sepolia`` (or a bare ``ethereum`` for a chain's default network).  This module is
the only place that builds or splits them (docs/decisions/architecture.md, "A network is a
value"): everything else holds a ``Network``, built once from the configuration, and reads
its parts.

A ``Network`` *is* its text (a ``str`` subclass, equal to and hashing like
``"chain/network"``), so a table keyed by networks still answers to the text it always
answered to, and the text written to a label, a log or a row is the one it always was.  It
is not encoded by msgspec as is: write ``str(net)`` (an exact ``str``) where it leaves the
process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NoReturn, get_args

Family = Literal["evm", "solana"]

_FAMILIES: tuple[str, ...] = get_args(Family)


class Network(str):
    """``chain`` and ``network`` as configured (``[chains.<chain>.<network>]``), the chain
    ``family`` (evm, solana), whether it is a ``testnet`` (where test keys may go), the REST
    ``alias`` (``chain-network``) and the URL form ``path`` (``b"chain/network"``).  Frozen;
    equality and hash are those of the text, so ``family`` and ``testnet`` describe a network
    but do not tell two apart (a network parsed from text is an evm mainnet's key: only
    ``Settings.networks()`` knows what a configured one is)."""

    chain: str
    network: str
    family: Family
    testnet: bool
    alias: str
    path: bytes

    def __new__(
        cls, chain: str, network: str, family: Family = "evm", testnet: bool = False
    ) -> Network:
        for part in (chain, network):
            if not part or "/" in part or not part.isprintable() or part != part.strip():
                raise ValueError(f"not a chain or network name: {part!r}")
        if family not in _FAMILIES:
            raise ValueError(f"not a chain family: {family!r}")
        self = super().__new__(cls, f"{chain}/{network}")
        fields = self.__dict__
        fields["chain"], fields["network"], fields["family"] = chain, network, family
        fields["testnet"] = testnet
        fields["alias"] = f"{chain}-{network}"
        fields["path"] = str.encode(self)
        return self

    @classmethod
    def parse(cls, text: str, family: Family = "evm") -> Network:
        """``chain/network`` → the network; ValueError for anything else."""
        chain, sep, network = text.partition("/")
        if not sep:
            raise ValueError(f"not chain/network: {text!r}")
        return cls(chain, network, family)

    @classmethod
    def of(cls, value: str) -> Network:
        """A network as is, or its ``chain/network`` text parsed (for callers, tests among
        them, that hold only the text)."""
        return value if isinstance(value, Network) else cls.parse(value)

    @classmethod
    def from_path(cls, raw: bytes, family: Family = "evm") -> Network:
        """A URL's ``chain/network`` bytes → the network; ValueError for anything else."""
        try:
            text = raw.decode()  # as ``path`` encodes it
        except UnicodeDecodeError:
            raise ValueError(f"not chain/network: {raw!r}") from None
        return cls.parse(text, family)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a Network is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"a Network is frozen: cannot delete {name}")

    def __reduce__(self) -> tuple[Any, ...]:
        return Network, (self.chain, self.network, self.family, self.testnet)

    def __repr__(self) -> str:
        testnet = ", testnet=True" if self.testnet else ""
        return f"Network({self.chain!r}, {self.network!r}, {self.family!r}{testnet})"


class NetworkNames:
    """The REST spelling: which network each accepted ``{chain}`` value names.

    * ``ethereum`` — the chain's ``mainnet`` when configured, else its only network; a chain
      with several networks and no mainnet must be named in full;
    * ``ethereum-sepolia`` — chain and network, explicitly (any configured network).
    """

    def __init__(self, networks: Iterable[str]) -> None:
        """``networks``: Networks (a text ``chain/network`` is parsed, for callers that hold
        only the text)."""
        keys = [Network.of(n) for n in networks]
        self.networks: dict[str, list[Network]] = {}
        for net in sorted(keys):
            self.networks.setdefault(net.chain, []).append(net)
        full: dict[str, Network | None] = {}
        for nets in self.networks.values():
            for net in nets:
                # Two networks spelling the same alias ("a-b"/"c" and "a"/"b-c"): neither gets it.
                full[net.alias] = None if net.alias in full else net
        self.names: dict[str, Network] = {a: net for a, net in full.items() if net is not None}
        for chain, nets in self.networks.items():
            default = self.default_network(nets)
            if default is not None:
                self.names[chain] = default  # a bare chain name wins
            else:
                self.names.pop(chain, None)

    @staticmethod
    def default_network(networks: list[Network]) -> Network | None:
        mainnet = next((net for net in networks if net.network == "mainnet"), None)
        if mainnet is not None:
            return mainnet
        return networks[0] if len(networks) == 1 else None

    def resolve(self, name: str) -> Network | None:
        return self.names.get(name)

    def name_of(self, net: str) -> str:
        """The shortest accepted name of a network."""
        net = Network.of(net)
        if self.names.get(net.chain) == net:
            return net.chain
        return next((a for a, n in sorted(self.names.items()) if n == net), str(net))
