"""``Network``: one network's three spellings parsed in one place, and what it refuses."""

from __future__ import annotations

import copy
import pickle

import msgspec
import pytest

from chaingate.config import ConfigError, from_mapping
from chaingate.config.network import Network, NetworkNames


def test_built_once_its_parts_and_spellings() -> None:
    net = Network("ethereum", "sepolia", "evm")
    assert (net.chain, net.network, net.family) == ("ethereum", "sepolia", "evm")
    assert net == "ethereum/sepolia" and str(net) == "ethereum/sepolia"
    assert type(str(net)) is str  # what leaves the process is a plain str
    assert net.alias == "ethereum-sepolia"
    assert net.path == b"ethereum/sepolia"
    assert repr(net) == "Network('ethereum', 'sepolia', 'evm')"


def test_the_text_and_the_url_bytes_parse_to_the_same_key() -> None:
    built = Network("solana", "devnet", "solana")
    parsed = Network.parse("solana/devnet", "solana")
    from_url = Network.from_path(b"solana/devnet", "solana")
    assert built == parsed == from_url
    assert {built: 1}[parsed] == 1
    assert from_url.family == "solana"
    accented = Network("caf\u00e9", "mainnet")
    assert Network.from_path(accented.path) == accented
    assert Network.of(built) is built
    assert Network.of("solana/devnet") == built


def test_a_table_keyed_by_networks_still_answers_to_the_text() -> None:
    table = {Network("ethereum", "devnet"): "service"}
    assert table["ethereum/devnet"] == "service"  # type: ignore[index]
    assert set(table) == {"ethereum/devnet"}


def test_the_family_describes_a_network_but_does_not_tell_two_apart() -> None:
    assert Network("x", "y", "solana") == Network("x", "y", "evm")
    assert hash(Network("x", "y", "solana")) == hash("x/y")


def test_testnet_describes_a_network_and_is_copied_with_it() -> None:
    sepolia = Network("ethereum", "sepolia", "evm", testnet=True)
    assert sepolia.testnet and not Network("ethereum", "sepolia").testnet
    assert sepolia == Network("ethereum", "sepolia")  # not part of its identity
    assert repr(sepolia) == "Network('ethereum', 'sepolia', 'evm', testnet=True)"
    assert f"on {sepolia}," == "on ethereum/sepolia,"  # a message names its text
    for copied in (pickle.loads(pickle.dumps(sepolia)), copy.deepcopy(sepolia)):
        assert copied.testnet


@pytest.mark.parametrize(
    "text",
    ["", "ethereum", "/sepolia", "ethereum/", "a/b/c", "a /b", "a/b\n", "eth\x00/x", "a\t/b"],
)
def test_bad_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not chain/network|not a chain or network name"):
        Network.parse(text)


@pytest.mark.parametrize("raw", [b"", b"ethereum", b"ethereum/", b"a/b/c", b"\xff/x", b"a/\xc3"])
def test_bad_url_bytes_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"not chain/network|not a chain or network name"):
        Network.from_path(raw)


def test_a_bad_part_or_family_is_refused() -> None:
    with pytest.raises(ValueError, match="not a chain or network name: ''"):
        Network("ethereum", "")
    with pytest.raises(ValueError, match="not a chain or network name: 'a/b'"):
        Network("a/b", "c")
    with pytest.raises(ValueError, match="not a chain family: 'bitcoin'"):
        Network("ethereum", "mainnet", "bitcoin")  # type: ignore[arg-type]


def test_frozen_and_copied_whole() -> None:
    net = Network("base", "sepolia", "evm")
    with pytest.raises(AttributeError):
        net.chain = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del net.network
    for copied in (pickle.loads(pickle.dumps(net)), copy.deepcopy(net), copy.copy(net)):
        assert copied == net and copied.family == "evm" and copied.path == net.path


def test_it_is_not_encoded_as_is_its_text_is() -> None:
    net = Network("ethereum", "devnet")
    with pytest.raises(TypeError):
        msgspec.json.encode({"network": net})
    assert msgspec.json.encode({"network": str(net)}) == b'{"network":"ethereum/devnet"}'


def test_the_rest_alias() -> None:
    names = NetworkNames(
        [
            Network("ethereum", "mainnet"),
            Network("ethereum", "sepolia"),
            Network("base", "sepolia"),
            Network("polygon", "amoy"),
            Network("polygon", "zkevm"),
        ]
    )
    assert names.resolve("ethereum") == Network("ethereum", "mainnet")
    assert names.resolve("ethereum-sepolia") == Network("ethereum", "sepolia")
    assert names.resolve("base") == Network("base", "sepolia")  # its only network
    assert names.resolve("polygon") is None  # two networks, no mainnet: name one
    assert names.resolve("polygon-zkevm") == Network("polygon", "zkevm")
    assert names.resolve("ethereum/sepolia") is None  # the text is not a REST name
    assert names.resolve("solana") is None
    resolved = names.resolve("ethereum-sepolia")
    assert resolved is not None and resolved.chain == "ethereum"  # a Network, not a string
    assert names.name_of(Network("ethereum", "mainnet")) == "ethereum"
    assert names.name_of(Network("ethereum", "sepolia")) == "ethereum-sepolia"
    assert names.name_of(Network("polygon", "amoy")) == "polygon-amoy"


def test_two_networks_spelling_one_alias_get_neither() -> None:
    names = NetworkNames([Network("a-b", "c"), Network("a", "b-c"), Network("a", "mainnet")])
    assert names.resolve("a-b-c") is None
    assert names.resolve("a") == Network("a", "mainnet")
    assert names.name_of(Network("a", "b-c")) == "a/b-c"  # no shorter name: the text


def test_config_builds_the_networks_once_with_their_family() -> None:
    upstream = [{"url": "http://127.0.0.1:8545"}]
    settings = from_mapping(
        {
            "chains": {
                "ethereum": {"sepolia": {"upstreams": upstream}},
                "solana": {"devnet": {"upstreams": upstream, "family": "solana"}},
            }
        },
        environ={},
    )
    networks = settings.networks()
    assert list(networks) == ["ethereum/sepolia", "solana/devnet"]
    assert [(n.chain, n.network, n.family) for n in networks] == [
        ("ethereum", "sepolia", "evm"),
        ("solana", "devnet", "solana"),
    ]


def test_config_builds_the_networks_with_their_testnet_flag() -> None:
    upstream = [{"url": "http://127.0.0.1:8545"}]
    chains = {
        "mainnet": {"upstreams": upstream},
        "sepolia": {"upstreams": upstream, "testnet": True},
    }
    networks = from_mapping({"chains": {"ethereum": chains}}, environ={}).networks()
    assert {str(n): n.testnet for n in networks} == {
        "ethereum/mainnet": False,
        "ethereum/sepolia": True,
    }
    assert all(n.testnet == settings.testnet for n, settings in networks.items())


@pytest.mark.parametrize("chain", ["a/b", " eth"])
def test_config_refuses_a_name_no_url_can_spell(chain: str) -> None:
    upstream = [{"url": "http://127.0.0.1:8545"}]
    with pytest.raises(ConfigError, match="not a chain or network name"):
        from_mapping({"chains": {chain: {"x": {"upstreams": upstream}}}}, environ={})
