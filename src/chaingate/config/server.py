"""The process's own sections: ``[server]``, ``[store]``, ``[auth]``, ``[rpc]``, ``[ws]``,
``[observability]``, ``[outbound]`` and ``[dashboard]``.
"""

from __future__ import annotations

from typing import Literal

import msgspec


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
