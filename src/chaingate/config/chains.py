"""One network's sections: ``[chains.<chain>.<network>]`` and the tables under it (its
upstreams, follower, indexer, gas, metadata, wallets, bundler, log ranges, read-your-writes,
hedging).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import msgspec

from chaingate.config.network import Family

# Headers chaingate writes itself on upstream requests, or that HTTP/2 forbids (RFC 9113 8.2.2).
RESERVED_UPSTREAM_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
    }
)


class UpstreamSettings(msgspec.Struct, forbid_unknown_fields=True):
    # The node's JSON-RPC URL, http:// or https:// (never logged: it may hold a key).
    url: str
    # A name for logs and metrics; "" shows host:port.
    name: str = ""
    # The node's WebSocket (ws:// or wss://): on EVM the follower takes newHeads from it,
    # else it polls; on Solana it is the node's PubSub, behind /v1/ws/solana/... subscriptions.
    ws_url: str | None = None
    # Extra request headers (for example a provider's auth header).  Never logged.
    headers: dict[str, str] = {}
    # For https:// upstreams behind a private CA: a PEM bundle to trust instead of the system's.
    ca_file: str | None = None
    # https:// only: "auto" offers HTTP/2 and HTTP/1.1 by ALPN and uses what the node picks;
    # "h2" insists on HTTP/2 (a node that refuses it cannot be connected); "http1" never
    # offers it.  HTTP/2 is one multiplexed connection; HTTP/1.1 a few pipelined ones.
    http_version: Literal["auto", "h2", "http1"] = "auto"
    # Seconds for one call's answer (timeout), and for a connection to open (connect_timeout).
    timeout: float = 10.0
    connect_timeout: float = 3.0
    # HTTP/1.1 connections; with HTTP/2 one is used, another only while all its streams are.
    max_connections: int = 8
    # Requests in flight on one connection (HTTP/1.1 pipelining) before another is opened.
    pipeline_depth: int = 32
    # Largest JSON-RPC batch sent to this node; bigger client batches are split.
    max_batch: int = 100
    # Largest answer accepted from this node.
    max_response_bytes: int = 64 << 20

    def display_name(self) -> str:
        """A name safe for logs and metrics: never the path or query (they often hold keys)."""
        if self.name:
            return self.name
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class FollowerSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The chain follower of one EVM network (see ``chaingate.chain.follower``)."""

    enabled: bool = True
    # First block to backfill from on the very first start; None starts at the current head.
    # Later starts resume from the stored cursor whatever this says.
    start_block: int | None = None
    # Recent block hashes (and their logs) kept to detect and undo reorgs; at least the
    # network's finality_depth (0 means exactly finality_depth).
    keep_blocks: int = 0
    # Head polling period in seconds; 0 means a quarter of block_time (at least 50 ms).
    poll_interval: float = 0.0
    # Largest eth_getLogs block range tried while backfilling; halved when a node refuses a
    # range, grown back after successes.
    max_log_range: int = 2000
    # Events buffered per consumer.  A consumer run in terms (indexer, webhooks, wallets,
    # bundler) that falls this far behind catches up from the window or the node instead;
    # the follower waits for the others (gas, WebSocket feed) when theirs is full.
    consumer_buffer: int = 256


class IndexerSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The token/NFT indexer of one EVM network (see ``chaingate.data.indexer``)."""

    # On wherever the network's follower runs.
    enabled: bool = True
    # First block to index on the very first start; None: the network's origin, the first block
    # this deployment followed (chaingate.chain.catchup).  Blocks below the follower's window
    # are fetched from the node.
    start_block: int | None = None
    # While backfilling, effects and cursor are committed every batch_blocks blocks,
    # batch_transfers transfers or batch_seconds seconds, whichever comes first; live blocks
    # are committed one by one.
    batch_blocks: int = 2000
    batch_transfers: int = 20_000
    batch_seconds: float = 2.0
    # Native (top-level) value transfers: fetched whole transactions and receipts.
    native_transfers: bool = True
    # Block hashes kept to recognise a block delivered again (0: max(4096, finality_depth+1)).
    keep_blocks: int = 0
    # Largest eth_getLogs range for the blocks the indexer fetches itself (0: the follower's).
    max_log_range: int = 0


class GasSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Gas price estimates (``GET /v1/gas/{chain}/prices``), recomputed on every new head."""

    # Blocks of eth_feeHistory the estimates look at.
    history_blocks: int = 20
    # Reward percentiles of those blocks for slow / standard / fast.
    percentiles: tuple[float, float, float] = (10.0, 50.0, 90.0)


class MetadataSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Token/NFT metadata, USD prices and logos of one EVM network (``chaingate.metadata``).

    Addresses left empty come from the network's devnet manifest when it has one.
    """

    # IPFS HTTP gateways, tried in turn (<gateway>/ipfs/<cid>/<path>); an operator's own
    # gateway first is best.  A gateway that fails or hangs past gateway_timeout: the next.
    ipfs_gateways: list[str] = msgspec.field(
        default_factory=lambda: ["https://ipfs.io", "https://dweb.link"]
    )
    # The gateway image_gateway_url points clients at; "" means the first of ipfs_gateways.
    image_gateway: str = ""
    arweave_gateway: str = "https://arweave.net"
    # Seconds per attempt: one gateway, or one http(s) metadata server.
    gateway_timeout: float = 8.0
    fetch_timeout: float = 10.0
    # Largest metadata JSON document (and data: URI) accepted.
    max_document_bytes: int = 1 << 20
    # Metadata documents fetched at once, per network.
    fetch_concurrency: int = 8
    # POST .../refresh: one accepted per token, and per contract, within these seconds.
    refresh_cooldown: float = 300.0
    contract_refresh_cooldown: float = 3600.0
    # Seconds before retry n after a failed fetch (the last value repeats), and how many
    # automatic attempts there are; after them an item is fetched again when asked for.
    retry_schedule: list[float] = msgspec.field(
        default_factory=lambda: [30.0, 120.0, 600.0, 3600.0, 21600.0, 86400.0]
    )
    max_attempts: int = 10
    # On-chain name/symbol/decimals are re-read this often; total supply at most this often.
    token_refresh_interval: float = 86400.0
    supply_ttl: float = 15.0
    # A Uniswap token list (JSON) for logo_url: a file path or an http(s) URL; "" for none.
    token_list: str = ""
    token_list_refresh: float = 86400.0
    # Chainlink-style USD feeds: token address -> feed address; the native currency's feed.
    price_feeds: dict[str, str] = {}
    native_price_feed: str = ""
    # A feed answer older than this (seconds, by the gateway's clock) is no price at all;
    # per-feed overrides by feed address.  0 turns the check off.
    max_feed_age: float = 90000.0
    feed_max_age: dict[str, float] = {}
    # Prices are re-read at most this often.
    price_ttl: float = 15.0
    # Multicall3's address; "" means the manifest's, else the canonical 0xcA11...CA11 when it
    # has code, else plain batched eth_calls.
    multicall3: str = ""


class WalletSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Smart wallets and gas sponsorship (ERC-4337) of one EVM network (``chaingate.wallets``).

    Addresses are by EntryPoint version ("0.6", "0.7", "0.8"); those left out come from the
    network's devnet manifest when it has one, else (EntryPoints and factories only) the canonical
    mainnet addresses.  Sponsorship needs a VerifyingPaymaster of ours: one whose signer is
    ``[paymaster] key``.
    """

    enabled: bool = True
    # The version of wallets created without entry_point_version.
    default_version: Literal["0.6", "0.7", "0.8"] = "0.7"
    entry_points: dict[str, str] = {}
    factories: dict[str, str] = {}
    paymasters: dict[str, str] = {}
    # The code EIP-7702 wallets delegate to ("": the manifest's, else v0.8's canonical
    # Simple7702Account).
    delegate: str = ""
    # Seconds a paymaster signature stays valid (its validUntil, from the chain's clock).
    signature_ttl: int = 600
    # After validUntil, how long an unused reservation still counts: the follower needs a few
    # blocks to report an operation included just before it.
    settle_grace: int = 120
    # v0.7 and v0.8 paymaster gas limits given when the request names none.
    paymaster_verification_gas: int = 100_000
    paymaster_post_op_gas: int = 0
    # A warning is logged while a paymaster's EntryPoint deposit is below this (wei, decimal).
    deposit_floor: str = "100000000000000000"
    # How often the paymasters' deposits are read for the metric (seconds).
    deposit_poll_interval: float = 60.0
    # Bounds: wallets per account, policies per account.
    max_wallets_per_account: int = 100_000
    max_policies_per_account: int = 1000


class NetworkBundlerSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The ERC-4337 bundler of one EVM network (``chaingate.bundler``).

    EntryPoint addresses are the wallets' (``wallets.entry_points``, else the manifest's,
    else the canonical ones); ``entry_points`` picks which versions are served.
    """

    enabled: bool = True
    entry_points: list[Literal["0.6", "0.7", "0.8"]] = msgspec.field(
        default_factory=lambda: ["0.6", "0.7", "0.8"]
    )
    # None: the process-wide ``[bundler] safe_mode``.  Unsafe skips the ERC-7562 tracing (for
    # nodes without debug_traceCall); simulation and every other check still run.
    safe_mode: bool | None = None
    # "auto": a bundle on every new head and every bundle_interval while operations wait;
    # "manual": only debug_bundler_sendBundleNow.
    mode: Literal["auto", "manual"] = "auto"
    bundle_interval: float = 1.0
    max_bundle_ops: int = 16
    max_bundle_gas: int = 10_000_000
    # Where handleOps pays the bundler's refund; "" is the bundler's own address.
    beneficiary: str = ""
    mempool_size: int = 5000
    # A verificationGasLimit above this is refused before any simulation (the known DoS: an
    # operation that makes every bundler simulate a block's worth of gas for nothing).
    max_verification_gas: int = 5_000_000
    max_call_gas: int = 20_000_000
    # The floor of maxPriorityFeePerGas (wei); maxFeePerGas must cover the base fee too.
    min_priority_fee: int = 0
    # An operation must stay valid this long after it is accepted (seconds; ERC-7562's 30 s).
    min_valid_for: int = 30
    # ERC-7562 MIN_STAKE_VALUE (wei, decimal) and MIN_UNSTAKE_DELAY (seconds).
    min_stake: str = "1000000000000000000"
    min_unstake_delay: int = 86_400
    # A bundle transaction not mined after this many seconds is sent again with fees +12.5%
    # (at once if the node dropped it: neither mined nor pending).
    resend_after: float = 30.0
    # Finished operations (included, failed, dropped) are kept this long for lookups (seconds).
    keep_finished: float = 7 * 86400.0


class LogRangeSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Block ranges of clients' ``eth_getLogs`` (``chaingate.rpc.logranges``)."""

    # The widest range a client may ask for (a plan's logs_max_block_range may lower it);
    # wider: error -32005 that states the limit.  0: no limit.
    max_block_range: int = 10_000
    # The widest range sent to a node in one call: a wider one (within max_block_range) is
    # split into calls of this size, merged in order.  Halved while a node refuses a part.
    # 0: never split.
    upstream_block_range: int = 2_000
    # Upstream calls of one split request in flight at once.
    split_concurrency: int = 4


class ReadYourWritesSettings(msgspec.Struct, forbid_unknown_fields=True):
    """After eth_sendRawTransaction went to upstream X, the sender's nonce and the
    transaction's lookups go to X for ``window`` seconds (``chaingate.rpc.stickiness``)."""

    enabled: bool = True
    window: float = 30.0
    # Senders and transaction hashes remembered at most (least recently used go first).
    max_entries: int = 100_000


class HedgeSettings(msgspec.Struct, forbid_unknown_fields=True):
    """A second upstream asked when the first is slow (``chaingate.rpc.hedging``).

    Retry-safe reads only.  The delay is the first upstream's recent p95 latency, within
    [min_delay, max_delay]; hedges are at most ``budget`` of calls (a token bucket that holds
    up to ``burst`` hedges)."""

    enabled: bool = False
    budget: float = 0.05
    burst: int = 10
    min_delay: float = 0.02
    max_delay: float = 2.0


# Defaults a network's family changes (a network that sets them keeps its own): a Solana
# slot is ~0.4 s, a validator calls itself behind past 128 slots, and the finalized slot is
# what the probe's getSlot answers, so no depth is added to it.
FAMILY_DEFAULTS: dict[str, dict[str, int | float]] = {
    "solana": {"finality_depth": 0, "block_time": 0.4, "max_head_lag": 128},
}


class NetworkSettings(msgspec.Struct, forbid_unknown_fields=True):
    # The nodes behind this network: one [[...upstreams]] table each, at least one.
    upstreams: list[UpstreamSettings]
    # The chain's JSON-RPC dialect: EVM (eth_*) or Solana.
    family: Family = "evm"
    # The chain id; None takes the upstreams' eth_chainId (upstreams on different
    # chains refuse the start).
    chain_id: int | None = None
    # Test keys (svc_test_...) may use only networks marked testnet.
    testnet: bool = False
    # Blocks after which a block cannot be reorganised away; responses about blocks this deep
    # are cached.  Solana: slots below the finalized slot, default 0 (the probe's getSlot
    # answers the finalized slot).
    finality_depth: int = 64
    # Seconds between blocks, roughly: paces head polling and head-lag judgement (Solana: 0.4).
    block_time: float = 12.0
    # Forward methods missing from the method table instead of answering -32601.
    passthrough: bool = False
    # An upstream whose head is further behind the best one than this is used last (Solana:
    # slots, default 128).
    max_head_lag: int = 5
    # A devnet manifest (JSON written by ``chaingate.devnet``): contract addresses by name,
    # for the components that need them (wallets, bundler, data).  Nothing hard-codes one.
    manifest: str = ""
    follower: FollowerSettings = msgspec.field(default_factory=lambda: FollowerSettings())
    gas: GasSettings = msgspec.field(default_factory=lambda: GasSettings())
    indexer: IndexerSettings = msgspec.field(default_factory=lambda: IndexerSettings())
    metadata: MetadataSettings = msgspec.field(default_factory=lambda: MetadataSettings())
    wallets: WalletSettings = msgspec.field(default_factory=lambda: WalletSettings())
    bundler: NetworkBundlerSettings = msgspec.field(
        default_factory=lambda: NetworkBundlerSettings()
    )
    logs: LogRangeSettings = msgspec.field(default_factory=lambda: LogRangeSettings())
    read_your_writes: ReadYourWritesSettings = msgspec.field(
        default_factory=lambda: ReadYourWritesSettings()
    )
    hedging: HedgeSettings = msgspec.field(default_factory=lambda: HedgeSettings())
