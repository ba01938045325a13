"""The subsystems' process-wide sections: ``[paymaster]``, ``[bundler]``, ``[webhooks]`` (with
``[webhooks.smtp]``) and ``[simulation]``.
"""

from __future__ import annotations

from typing import Literal

import msgspec


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
