"""Typed settings: msgspec Structs loaded from a TOML file, with environment overrides.

Precedence: built-in defaults < the TOML file < environment variables.  An environment
variable ``CHAINGATE_<SECTION>__<KEY>`` overrides ``[section] key`` (for example
``CHAINGATE_SERVER__PORT=9000``); its value is read as a TOML literal when it parses as one
(numbers, booleans, quoted strings) and as a plain string otherwise.  Secrets such as
``observability.admin_token`` are best given this way rather than written into the file.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec
import msgspec.inspect

from chaingate.config.leases import MIN_LEADER_TIMEOUT, QUERY_TIMEOUT
from chaingate.config.network import Family, Network

ENV_PREFIX = "CHAINGATE_"


class ConfigError(Exception):
    """The configuration cannot be used; the message says which setting and why."""


class ServerSettings(msgspec.Struct, forbid_unknown_fields=True):
    # The address the one public port listens on; 0.0.0.0 (or ::) for every interface.
    host: str = "127.0.0.1"
    # The public port: JSON-RPC, REST, WebSocket, the dashboard and /metrics.
    port: int = 8000
    # Connections the kernel queues before they are accepted (listen's backlog).
    backlog: int = 1024
    # SO_REUSEPORT on the listening socket (serve --workers sets it itself).
    reuse_port: bool = False
    # Processes serving this port (`chaingate serve`; SO_REUSEPORT spreads connections over
    # them): a number, or "auto" for the CPUs the process may use.  More than one needs the
    # store on PostgreSQL and auth.redis_url (docs/guides/operator.md).
    workers: int | Literal["auto"] = 1
    # Processes sharing a PostgreSQL store lead each single-writer role by a lease that each
    # renews every half second; one silent this long (seconds: a stopped process, a hung
    # event loop) loses its roles to another, which ends its sessions.  At least 4 (a look
    # may take 3 s before its process counts its connection lost, plus two looks' interval).
    leader_timeout: float = 5.0
    # Client connections at most; 0 derives it from the process's file-descriptor limit (the
    # soft limit is raised to the hard one at start), minus a reserve for upstreams, the
    # store and logs.  A value above what the descriptors allow is lowered to fit.
    max_connections: int = 0
    # Client connections per address (an IPv6 client is its /64); 0 means half of
    # max_connections.  At either cap the longest-idle connection makes room, else the new
    # one is refused with 503.
    max_connections_per_ip: int = 0
    # Under pressure (more than 3/4 of max_connections open) idle keep-alive connections are
    # closed after this long instead of idle_timeout.
    pressure_idle_timeout: float = 5.0
    # Bytes of answers written but not yet taken by slow clients, all connections together;
    # beyond it new requests get 503 (overload) until the backlog drains.
    max_unsent_bytes: int = 256 << 20
    # Failed authentications (401) after which a connection is closed.
    max_auth_failures: int = 10
    # Bounds on a request's head: max_request_line bytes of request line (else 414),
    # max_header_bytes of headers and max_headers header lines (else 431).
    max_request_line: int = 8192
    max_header_bytes: int = 16_384
    max_headers: int = 100
    # Also the cap on a gzip request body once inflated (a zip bomb is 413).
    max_body_bytes: int = 1 << 20
    # Answers of at least this many bytes are compressed (zstd or gzip, as the client's
    # Accept-Encoding allows); 0 turns answer compression off.  Smaller answers fit one TCP
    # segment with their head: compressing them costs CPU and saves no packet.
    compress_min_bytes: int = 1400
    # A keep-alive connection with no request in progress is closed after this long.
    idle_timeout: float = 60.0
    # Time allowed from the first byte of a request to its last (slow clients are cut off).
    client_read_timeout: float = 20.0
    # Time allowed to write one response to a client that stopped reading.
    client_write_timeout: float = 20.0
    # On shutdown, in-flight requests get this long to finish before being cancelled.
    shutdown_grace: float = 10.0


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
    # The node's WebSocket (ws:// or wss://): the follower takes newHeads from it, else
    # it polls.
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


class WebSocketSettings(msgspec.Struct, forbid_unknown_fields=True):
    """``/v1/ws/{chain}/{network}`` (see ``chaingate.ws``); per-plan caps are in plans.toml."""

    # Largest message a client may send (bigger: closed with 1009).
    max_message_bytes: int = 1 << 20
    # permessage-deflate is offered back to clients that ask for it; replies of at least this
    # many bytes are then deflated (0: never negotiated).  Inflated client messages are held
    # to max_message_bytes.
    compress_min_bytes: int = 1400
    # Bytes queued for one client beyond what its socket took; a push that does not fit
    # closes the connection with 1008 (a slow reader never grows memory).
    send_queue_bytes: int = 1 << 20
    # SO_SNDBUF of an upgraded socket (0: the kernel's autotuning, up to tcp_wmem's 4 MiB on
    # Linux).  Bounds kernel memory per slow client, and how far behind it can fall before
    # the send queue notices.
    socket_send_buffer: int = 256 << 10
    # JSON-RPC calls of one connection answered concurrently (the rest wait: backpressure).
    max_inflight: int = 16
    # Ceiling on subscriptions per connection whatever the plan says (0 in a plan: this).
    max_subscriptions: int = 10_000
    # Ceilings on logs filters whatever the plan says (0 in a plan: these): addresses, and
    # topic alternatives over all positions, in one filter (over: -32602); filter bytes (20
    # per address, 32 per topic) held by one connection (over: -32005; 0: no ceiling).
    max_filter_addresses: int = 1000
    max_filter_topics: int = 4000
    max_filter_bytes_per_connection: int = 8 << 20
    # A ping when the client was silent this long; closed when no pong within pong_timeout.
    ping_interval: float = 30.0
    pong_timeout: float = 20.0
    # How long a closing handshake (or flushing a queue that stopped moving) may take.
    close_timeout: float = 2.0
    write_timeout: float = 20.0
    # newPendingTransactions: each upstream's pending filter is polled this often.
    pending_poll_interval: float = 0.5
    # syncing: eth_syncing is polled this often while someone subscribes.
    syncing_poll_interval: float = 2.0


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
    # Blocks (slots on Solana) after which a block cannot be reorganised away; responses about
    # blocks this deep are cached.
    finality_depth: int = 64
    # Seconds between blocks, roughly: paces head polling and head-lag judgement.
    block_time: float = 12.0
    # Forward methods missing from the method table instead of answering -32601.
    passthrough: bool = False
    # An upstream whose head is further behind the best one than this is used last.
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


class RpcSettings(msgspec.Struct, forbid_unknown_fields=True):
    # The JSON-RPC method table: scope, compute units, caching, retries (a path, beside
    # this file or the shipped config/).
    methods_file: str = "methods.toml"
    # Calls in one JSON-RPC batch at most (over: the whole batch is refused).
    max_batch: int = 1000
    # Whole-request deadline across every failover attempt.
    request_timeout: float = 30.0
    # Identical reads in flight at once share one upstream call.
    coalesce: bool = True
    # The cache of answers that cannot change (cache = "static"/"finalized" in the method
    # table): cache_max_entries entries and cache_max_bytes bytes at most, least recently
    # used evicted first.
    cache_max_entries: int = 100_000
    cache_max_bytes: int = 64 << 20
    # Seconds between health probes of each upstream (its head, its latency).
    probe_interval: float = 1.0
    # Consecutive failures after which an upstream is taken out of rotation.
    failure_threshold: int = 3
    # How far ahead of the agreed head an upstream's head may be, in seconds of blocks
    # (block_time), on top of max_head_lag and the blocks the clock allows since the agreed
    # head was reached; beyond it the head is a fault and the upstream goes out of rotation.
    max_head_lead: float = 600.0
    # Bytes of one request's answer (a batch: all its replies together); past it the
    # remaining calls get JSON-RPC error -32005 "answer too large" (docs/decisions/hardening.md,
    # "The answer bound").
    max_answer_bytes: int = 64 << 20
    # Reply bytes of batches being assembled, all requests of the process together; past it
    # further replies get -32005 "server busy" until assembled answers are handed on.
    max_assembling_bytes: int = 256 << 20


class ObservabilitySettings(msgspec.Struct, forbid_unknown_fields=True):
    # Bearer token of /metrics and of the dashboard's operator sign-in; "" turns both
    # off.  Give it through CHAINGATE_OBSERVABILITY__ADMIN_TOKEN.
    admin_token: str = ""
    # One JSON line per request on stderr (keys never shown).
    access_log: bool = True
    # Log bytes held while the log stream is slow (a pipe nobody reads); beyond it lines are
    # dropped and counted, never the server stalled.
    log_buffer_bytes: int = 4 << 20
    # The least severe log lines written (JSON, on stderr).
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class OutboundSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Where chaingate's own outbound HTTP (NFT metadata, token lists, webhooks) may go.

    Public addresses only, by default.  Loopback is never a setting: only ``chaingate dev``
    (and tests) allow it, so no production configuration can turn it on.
    """

    # RFC 1918, unique local (fc00::/7) and CGNAT addresses: for an operator's own IPFS
    # gateway or webhook receivers on a private network.
    allow_private: bool = False
    # Exactly these networks (one internal host rather than all of them).
    allow_cidrs: list[str] = []
    # None: every port.
    allowed_ports: list[int] | None = None


class PaymasterSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The key that signs sponsorships (the VerifyingPaymasters' signer), never logged.

    Give it as a file holding the 0x-hex key (mode 0600), or through CHAINGATE_PAYMASTER__KEY;
    without one, sponsorship answers 503.  ``chaingate dev`` uses the one under its data dir.
    """

    key: str = ""
    key_file: str = ""


class BundlerSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The process's bundler: its EOA and the admin methods.

    The key signs bundle transactions (it pays their gas and gets the refunds); give it as a
    file holding the 0x-hex key, or through CHAINGATE_BUNDLER__KEY.  Without one the bundler
    validates and keeps operations but sends no bundle (it says so at start).
    ``chaingate dev`` generates and funds one in its data dir.
    """

    enabled: bool = True
    key: str = ""
    key_file: str = ""
    safe_mode: bool = True
    # debug_bundler_* (clear state, dump the mempool, bundle now, reputation): admin methods,
    # off in production, on in ``chaingate dev``.
    debug: bool = False


class SmtpSettings(msgspec.Struct, forbid_unknown_fields=True):
    """The mail server that tells an account's owner a webhook was paused (variant A).

    ``url``: ``smtp://host:port`` (STARTTLS when the server offers it and ``starttls``),
    ``smtps://host:port`` (TLS from the start); "" sends no mail (the pause is logged).  Give a
    password through CHAINGATE_WEBHOOKS__SMTP__PASSWORD, never in the file.
    """

    url: str = ""
    sender: str = "chaingate@localhost"
    username: str = ""
    password: str = ""
    starttls: bool = True
    timeout: float = 15.0


class WebhookSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Signed webhooks (``chaingate.webhooks``); docs/decisions/webhooks.md."""

    enabled: bool = True
    # Event names, envelope, headers, signature and retry rules: the spec's variant A or B.
    variant: Literal["a", "b"] = "a"
    # A delivery fails when the receiver has not answered within this many seconds.
    timeout: float = 15.0
    # Deliveries in flight, all webhooks together, and to one webhook's URL.
    max_concurrency: int = 256
    max_per_endpoint: int = 16
    # Ceilings over every plan: webhooks per account, addresses (and other filter values) in
    # one webhook's config.
    max_webhooks_per_account: int = 1000
    max_addresses_per_webhook: int = 100_000
    max_confirmations: int = 128
    # Events one claim leases, and for how long (a worker that dies gives them back then).
    # Big claims: each costs a query whatever its size (200 -> 1000: 1,900 -> 2,000 deliveries/s
    # a second on SQLite, 490 -> 1,320 on PostgreSQL, in bench/webhooks.py).
    claim_batch: int = 1000
    lease_seconds: float = 60.0
    # How often the outbox is looked at when nothing woke the workers.
    poll_interval: float = 0.5
    # After a secret rotation, how long the old secret also signs (seconds).
    secret_overlap: float = 86_400.0
    # Delivered, failed and cancelled events, and attempts, are kept this long (days).
    retention_days: int = 30
    # Bytes of a receiver's answer kept in the delivery log.
    response_log_bytes: int = 1024
    # Plain-HTTP receivers.  Production is HTTPS only; `chaingate dev` allows http:// (its
    # receivers are on loopback, which only dev's outbound policy allows anyway).
    allow_http: bool = False
    # PENDING_TRANSACTION (variant B): poll the node's pending block this often (seconds).
    pending_poll_interval: float = 1.0
    smtp: SmtpSettings = msgspec.field(default_factory=SmtpSettings)


class StoreSettings(msgspec.Struct, forbid_unknown_fields=True):
    # "" is the embedded default: sqlite file chaingate.db under data_dir.  Otherwise
    # sqlite:///abs/path.db or postgresql://...; give a URL holding a password through
    # CHAINGATE_STORE__URL rather than in the file.
    url: str = ""
    # PostgreSQL connections (and worker threads using them) at most.
    pool_size: int = 8


class AuthSettings(msgspec.Struct, forbid_unknown_fields=True):
    # API keys, scopes, plans and limits on every request.  Off only for a closed network.
    enabled: bool = True
    # Server-side secret of the keyed hash of API keys.  Give it through CHAINGATE_AUTH__PEPPER;
    # changing it invalidates every key.  `chaingate dev` keeps one under its data dir.
    pepper: str = ""
    # The plans' limits (a path, beside this file or the shipped config/plans.toml).
    plans_file: str = "plans.toml"
    # How often each process re-reads changed keys and accounts (revocation delay).
    refresh_interval: float = 0.25
    # How often metered usage is written to the store.
    usage_flush_interval: float = 2.0
    # Shared rate-limit counters across processes; "" keeps limits per process.
    redis_url: str = ""


class DashboardSettings(msgspec.Struct, forbid_unknown_fields=True):
    # The dashboard at /dashboard/ on the server's port (chaingate.dashboard; needs API keys).
    enabled: bool = True
    # Session cookies carry Secure (sent over HTTPS only); `chaingate dev` turns it off.
    secure_cookie: bool = True
    # A session ends after this long without a request, and this long after sign-in at most
    # (OWASP ASVS 4 level 2, 3.3.2: sign in again after 30 minutes idle and within 12 hours).
    session_idle_minutes: int = 30
    session_max_hours: int = 12
    # Failed sign-ins tolerated per account and per client address within login_window
    # seconds; beyond them sign-in is refused (even with the right password) until it passes.
    login_failures_per_account: int = 5
    login_failures_per_address: int = 20
    login_window: float = 900.0
    # How often the deployment's latency (the operator's page) is sampled from the edge's
    # histogram.
    latency_sample_seconds: float = 60.0
    # Reverse proxies (CIDRs) whose X-Forwarded-For names the client (sign-in throttling) and
    # whose X-Forwarded-Host names the site (the forms' Origin check); empty: none trusted.
    trusted_proxies: list[str] = []


class SimulationSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Transaction simulation (``chaingate.simulation``): asset changes and traces of
    transactions, bundles and UserOperations before they are signed."""

    enabled: bool = True
    # "auto": eth_simulateV1 where an upstream has it, else debug_traceCall (which execution
    # traces always use); "simulate_v1" or "trace_call" forces one (docs/decisions/simulation.md).
    engine: Literal["auto", "simulate_v1", "trace_call"] = "auto"
    # Bounds: transactions per bundle, call frames and logs of one simulation, bytes of one
    # node answer, seconds of the whole simulation (past it: -32005, never a stuck request).
    max_bundle: int = 10
    max_frames: int = 10_000
    max_logs: int = 10_000
    max_answer_bytes: int = 16 << 20
    timeout: float = 10.0
    # Simulations in progress in one process; the next ones wait (within their timeout).
    max_concurrent: int = 32


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    rpc: RpcSettings = msgspec.field(default_factory=RpcSettings)
    observability: ObservabilitySettings = msgspec.field(default_factory=ObservabilitySettings)
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    ws: WebSocketSettings = msgspec.field(default_factory=WebSocketSettings)
    outbound: OutboundSettings = msgspec.field(default_factory=OutboundSettings)
    paymaster: PaymasterSettings = msgspec.field(default_factory=PaymasterSettings)
    webhooks: WebhookSettings = msgspec.field(default_factory=WebhookSettings)
    bundler: BundlerSettings = msgspec.field(default_factory=BundlerSettings)
    dashboard: DashboardSettings = msgspec.field(default_factory=DashboardSettings)
    simulation: SimulationSettings = msgspec.field(default_factory=SimulationSettings)
    # Where the embedded SQLite store and chaingate dev's files live.
    data_dir: str = "~/.local/share/chaingate"
    chains: dict[str, dict[str, NetworkSettings]] = {}
    # Where relative paths in this file (methods_file) are resolved; set by the loader.
    config_dir: str = ""

    def network(self, chain: str, network: str) -> NetworkSettings | None:
        return self.chains.get(chain, {}).get(network)

    def networks(self) -> dict[Network, NetworkSettings]:
        """Every configured network, keyed by its ``Network`` (built here, once)."""
        return {
            Network(chain, name, net.family): net
            for chain, networks in self.chains.items()
            for name, net in networks.items()
        }


def default_config_dir() -> Path:
    """The repository's ``config/`` in a source checkout, else the copy shipped in the package."""
    package = Path(__file__).resolve().parents[1]  # this file is chaingate/config/__init__.py
    checkout = package.parents[1] / "config"
    if (checkout / "methods.toml").is_file():
        return checkout
    return package / "_defaults"


def _coerce_env_value(raw: str) -> object:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_target(path: list[str]) -> msgspec.inspect.Type | None:
    """The type of the setting a variable's path names; None if it names no setting.

    Any section or nested table of sections is reachable (``WEBHOOKS__SMTP__PASSWORD``);
    tables keyed by the operator's names (chains, plans) are the file's to give.
    """
    kind: msgspec.inspect.Type = msgspec.inspect.type_info(Settings)
    for part in path:
        if not isinstance(kind, msgspec.inspect.StructType):
            return None
        fields = {f.name: f.type for f in kind.fields}
        if part not in fields:
            return None
        kind = fields[part]
    return kind


def apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``CHAINGATE_<SECTION>__<KEY>`` variables onto a raw settings mapping."""
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        kind = _env_target(path)
        if kind is None or isinstance(kind, msgspec.inspect.StructType | msgspec.inspect.DictType):
            continue
        table = data
        for part in path[:-1]:
            table = table.setdefault(part, {})
        # A text setting is taken as given: read as TOML, a 0x-hex key or an all-digit pepper
        # would become an integer.
        text = isinstance(kind, msgspec.inspect.StrType)
        table[path[-1]] = raw if text else _coerce_env_value(raw)
    return data


def _validate(settings: Settings) -> None:
    for cidr in settings.outbound.allow_cidrs:
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"outbound.allow_cidrs: not a network: {cidr!r}") from None
    for cidr in settings.dashboard.trusted_proxies:
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"dashboard.trusted_proxies: not a network: {cidr!r}") from None
    if settings.dashboard.session_idle_minutes < 1 or settings.dashboard.session_max_hours < 1:
        raise ConfigError("dashboard.session_idle_minutes and session_max_hours must be >= 1")
    if not 0 <= settings.server.port <= 65535:
        raise ConfigError("server.port must be between 0 and 65535")
    if settings.server.compress_min_bytes < 0:
        raise ConfigError("server.compress_min_bytes must be >= 0 (0: no compression)")
    workers = settings.server.workers
    if workers != "auto" and not 1 <= workers <= 256:
        raise ConfigError('server.workers must be between 1 and 256, or "auto"')
    if not MIN_LEADER_TIMEOUT <= settings.server.leader_timeout <= 3600:
        raise ConfigError(
            f"server.leader_timeout must be between {MIN_LEADER_TIMEOUT:g} and 3600 seconds"
            f" (a look at the locks may take {QUERY_TIMEOUT:g} s before its process counts"
            " its connection lost)"
        )
    if settings.store.pool_size < 1:
        raise ConfigError("store.pool_size must be >= 1")
    simulation = settings.simulation
    if min(simulation.max_bundle, simulation.max_frames, simulation.max_logs) < 1:
        raise ConfigError("simulation.max_bundle, max_frames and max_logs must be >= 1")
    if simulation.timeout <= 0 or simulation.max_concurrent < 1:
        raise ConfigError("simulation.timeout must be > 0 and max_concurrent >= 1")
    if settings.store.url and not settings.store.url.startswith(
        ("sqlite:///", "postgresql://", "postgres://")
    ):
        # Never echo the URL: it may carry a password.
        raise ConfigError("store.url must start with sqlite:///, postgresql:// or postgres://")
    for chain, networks in settings.chains.items():
        for network, net in networks.items():
            where = f"chains.{chain}.{network}"
            try:
                Network(chain, network, net.family)
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            if not net.upstreams:
                raise ConfigError(f"{where}: at least one upstream is required")
            names = set()
            for upstream in net.upstreams:
                parts = urlsplit(upstream.url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ConfigError(f"{where}: upstream url must be http:// or https://")
                if upstream.ws_url is not None:
                    ws = urlsplit(upstream.ws_url)
                    if ws.scheme not in ("ws", "wss") or not ws.hostname:
                        raise ConfigError(f"{where}: upstream ws_url must be ws:// or wss://")
                name = upstream.display_name()
                if name in names:
                    raise ConfigError(f"{where}: two upstreams named {name!r}; set distinct names")
                names.add(name)
                if upstream.http_version == "h2" and parts.scheme != "https":
                    raise ConfigError(f'{where}: http_version = "h2" needs an https:// url')
                for header, value in upstream.headers.items():
                    if (
                        any(c in header + value for c in "\r\n")
                        or not header.strip()
                        or not header.isascii()
                        or any(c in header for c in " :\t")
                    ):
                        raise ConfigError(f"{where}: invalid upstream header {header!r}")
                    if header.lower() in RESERVED_UPSTREAM_HEADERS:
                        raise ConfigError(
                            f"{where}: upstream header {header!r} is chaingate's to set"
                        )
                if upstream.pipeline_depth < 1 or upstream.max_connections < 1:
                    raise ConfigError(f"{where}: pipeline_depth and max_connections must be >= 1")


def from_mapping(
    data: Mapping[str, Any],
    *,
    config_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build Settings from a parsed TOML mapping plus the environment."""
    raw = apply_env(dict(data), os.environ if environ is None else environ)
    raw["config_dir"] = str(config_dir or default_config_dir())
    try:
        settings = msgspec.convert(raw, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    _validate(settings)
    return settings


def load(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Settings:
    """Read a TOML config file (see ``config/chaingate.example.toml``)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return from_mapping(data, config_dir=path.parent.resolve(), environ=environ)


def config_file(settings: Settings, name: str) -> Path:
    """A file named in the settings: absolute, beside the config file, or shipped default."""
    path = Path(name)
    if path.is_absolute():
        return path
    candidate = Path(settings.config_dir) / path
    if candidate.is_file():
        return candidate
    return default_config_dir() / path


def methods_path(settings: Settings) -> Path:
    return config_file(settings, settings.rpc.methods_file)


def follows_any(settings: Settings) -> bool:
    """Whether some EVM network is followed (so the process needs a store)."""
    return any(
        net.family == "evm" and net.follower.enabled
        for networks in settings.chains.values()
        for net in networks.values()
    )
