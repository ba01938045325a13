"""What the wallet, gas policy and sponsorship resources share: whose records a call reaches,
the service behind them, and how the service's refusals become the spec's errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.wallets.model import InvalidOperation, LimitReached, PolicyRefused, account_of
from chaingate.wallets.network import NotServed, Unavailable
from chaingate.wallets.service import WalletService

__all__ = ["account_of", "service_of", "unavailable"]


def service_of(deps: ApiDeps) -> WalletService:
    if deps.wallets is None:
        raise ApiError(404, "smart wallets and gas policies need a store and an EVM network")
    service: WalletService = deps.wallets
    return service


@contextmanager
def unavailable() -> Iterator[None]:
    """Service exceptions as API errors: 404 for what this deployment does not offer on the
    network (as for gas prices of a network not followed), 503 (with Retry-After) for what
    its node cannot do now, 400 for an operation that cannot be sponsored as sent, 403/429
    for a policy's refusal (429 with Retry-After where waiting helps), naming the rule."""
    try:
        yield
    except NotServed as exc:
        raise ApiError(404, str(exc)) from None
    except Unavailable as exc:
        raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from None
    except InvalidOperation as exc:
        raise ApiError(400, str(exc)) from None
    except LimitReached as exc:
        raise ApiError(403, str(exc)) from None
    except PolicyRefused as exc:
        refusal = exc.refusal
        message = f"gas policy {exc.policy_id} refuses: rule {refusal.rule}: {refusal.message}"
        if refusal.retry_after is not None:
            raise ApiError(
                429, message, headers={"Retry-After": str(refusal.retry_after)}
            ) from None
        raise ApiError(403, message) from None
    except LookupError as exc:
        raise ApiError(404, f"no gas policy {exc.args[0]} in this account") from None
