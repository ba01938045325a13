"""The fast lane of this process: every JSON-RPC endpoint, the key gate's view, the books.

Built once by the gateway from the RPC services (each owns its ``Route``), the gate and the
handler's books (``Routes.ledger``), so that an answer given by the lane is counted, logged
and metered exactly where one given by the handler is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaingate.auth.gate import ANONYMOUS, Gate
from chaingate.config.network import Network
from chaingate.edge import cors
from chaingate.edge.routes import Routes
from chaingate.envelope import error_body
from chaingate.redaction import loggable_path
from chaingate.rpc.service import RpcService
from chaingate.twins import Impl
from chaingate.twintypes.fastlane import Admission, Lane, Route

RPC_PREFIX = b"/v1/rpc/"


def build_lane(
    impl: Impl,
    services: Mapping[Network, RpcService],
    gate: Gate,
    routes: Routes,
) -> Lane:
    fastlane = impl.fastlane
    paths: dict[bytes, Route] = {}
    for key, service in services.items():
        path = RPC_PREFIX + key.path
        paths[path] = paths[path + b"/"] = service.route  # a trailing slash: the same endpoint
    admission: Admission[Any] = getattr(gate, "admission", None) or fastlane.OpenAdmission(
        ANONYMOUS
    )
    return fastlane.Lane(
        paths, admission, routes.ledger, routes.ids, cors.answer_headers, error_body, loggable_path
    )
