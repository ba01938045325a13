"""Gas policies (rules editor, ledger, dry run), wallets (status, deploy transaction) and the
bundler (a sender's pending operations, an operation's status by hash).  Policies and
wallets go through their REST handlers; the bundler through its JSON-RPC endpoint's own
methods (``chaingate_getPendingUserOperations``, ``chaingate_getUserOperationStatus``), run
in process as the edge runs them."""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Blueprint, g, redirect, request
from quart.typing import ResponseReturnValue

from chaingate.api.errors import ApiError
from chaingate.config.network import Network
from chaingate.dashboard.restcalls import principal_for
from chaingate.dashboard.web import (
    PREFIX,
    Dashboard,
    chain_names,
    form_value,
    json_object,
    page,
    page_number,
    signed_in,
)
from chaingate.rpc import local as local_rpc

EXAMPLE_RULES = '{\n  "max_gas_usd": "20",\n  "max_per_user_per_day": 10\n}'


def register(bp: Blueprint, dash: Dashboard) -> None:
    _register_policies(bp, dash)
    _register_wallets_and_bundler(bp, dash)


async def _policies_page(
    dash: Dashboard, status: int = 200, **context: object
) -> ResponseReturnValue:
    """The account's gas policies and the form to create one."""
    query = {"page": page_number()}  # a bad one: the 400 page
    try:
        listed = await dash.rest("listGasPolicies", g.session.account_id, query=query)
    except ApiError as exc:
        listed = {"policies": [], "page": 1, "total": 0, "limit": 25}
        context.setdefault("error", exc.message)
    return await page(
        "policies.html",
        status,
        title="Gas policies",
        listed=listed,
        chains=chain_names(dash),
        example_rules=EXAMPLE_RULES,
        **context,
    )


async def _policy_page(
    dash: Dashboard, policy_id: str, status: int = 200, **context: object
) -> ResponseReturnValue:
    """One policy: its rules (editable) and spend, and the dry-run form."""
    try:
        policy = await dash.rest("getGasPolicy", g.session.account_id, path={"id": policy_id[:64]})
    except ApiError as exc:
        return await page("error.html", exc.status, title="Gas policy", message=exc.message)
    rules = msgspec.json.format(msgspec.json.encode(policy["rules"]), indent=2).decode()
    return await page(
        "policy.html",
        status,
        title=f"Policy {policy['name']}",
        policy=policy,
        rules_text=context.pop("rules_text", rules),
        **context,
    )


def _register_policies(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/policies", methods=["GET"])
    @signed_in
    async def policies() -> ResponseReturnValue:
        return await _policies_page(
            dash,
        )

    @bp.route("/policies", methods=["POST"])
    @signed_in
    async def create_policy() -> ResponseReturnValue:
        form = await request.form
        try:
            body = {
                "name": form_value(form, "name"),
                "chain": form_value(form, "chain"),
                "rules": json_object(form_value(form, "rules"), "rules"),
            }
            created = await dash.rest("createGasPolicy", g.session.account_id, body=body)
        except ApiError as exc:
            return await _policies_page(dash, exc.status, error=exc.message, form=dict(form))
        return redirect(f"{PREFIX}/policies/{created['id']}", 303)

    @bp.route("/policies/<policy_id>", methods=["GET"])
    @signed_in
    async def policy(policy_id: str) -> ResponseReturnValue:
        return await _policy_page(dash, policy_id)

    @bp.route("/policies/<policy_id>/rules", methods=["POST"])
    @signed_in
    async def edit_rules(policy_id: str) -> ResponseReturnValue:
        form = await request.form
        text = form_value(form, "rules")
        try:
            body: dict[str, Any] = {"rules": json_object(text, "rules")}
            status = form_value(form, "status")
            if status in ("active", "paused"):
                body["status"] = status
            await dash.rest(
                "updateGasPolicy", g.session.account_id, path={"id": policy_id[:64]}, body=body
            )
        except ApiError as exc:
            if exc.status == 404:
                return await page("error.html", 404, title="Gas policy", message=exc.message)
            return await _policy_page(
                dash, policy_id, exc.status, error=exc.message, rules_text=text
            )
        return await _policy_page(dash, policy_id, message="Rules saved.")

    @bp.route("/policies/<policy_id>/evaluate", methods=["POST"])
    @signed_in
    async def dry_run(policy_id: str) -> ResponseReturnValue:
        form = await request.form
        text = form_value(form, "user_operation")
        try:
            body = {"user_operation": json_object(text, "user_operation")}
            result = await dash.rest(
                "evaluateGasPolicy", g.session.account_id, path={"id": policy_id[:64]}, body=body
            )
        except ApiError as exc:
            if exc.status == 404:
                return await page("error.html", 404, title="Gas policy", message=exc.message)
            return await _policy_page(
                dash, policy_id, exc.status, error=exc.message, operation=text
            )
        return await _policy_page(dash, policy_id, evaluation=result, operation=text)


def _register_wallets_and_bundler(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/wallets", methods=["GET"])
    @signed_in
    async def wallets() -> ResponseReturnValue:
        account = g.session.account_id
        error = ""
        detail = None
        try:
            listed = await dash.rest("listWallets", account, query={"page": page_number()})
        except ApiError as exc:
            listed = {"wallets": [], "page": 1, "total": 0}
            error = exc.message
        address = request.args.get("address", "").strip()[:64]
        if address:
            try:
                detail = await dash.rest("getWallet", account, path={"address": address})
            except ApiError as exc:
                error = exc.message
        return await page(
            "wallets.html",
            200 if not error else 400,
            title="Wallets",
            listed=listed,
            detail=detail,
            address=address,
            error=error,
        )

    @bp.route("/bundler", methods=["GET"])
    @signed_in
    async def bundler() -> ResponseReturnValue:
        networks = sorted(dash.bundlers)
        network = request.args.get("network", networks[0] if networks else "")
        sender = request.args.get("sender", "").strip()[:66]
        op_hash = request.args.get("hash", "").strip()[:66]
        pending = op_status = None
        error = ""
        try:
            endpoint = dash.bundlers.get(Network.parse(network))
        except ValueError:  # not chain/network: no such bundler
            endpoint = None
        if (sender or op_hash) and endpoint is None:
            error = "no bundler on that network"
        elif endpoint is not None:
            try:
                if sender:
                    pending = await _rpc(
                        endpoint, "chaingate_getPendingUserOperations", [sender], g.session
                    )
                if op_hash:
                    op_status = await _rpc(
                        endpoint, "chaingate_getUserOperationStatus", [op_hash], g.session
                    )
            except ApiError as exc:
                error = exc.message
        return await page(
            "bundler.html",
            200 if not error else 400,
            title="Bundler",
            networks=networks,
            network=network,
            sender=sender,
            op_hash=op_hash,
            pending=pending,
            op_status=op_status,
            error=error,
        )


async def _rpc(endpoint: Any, method: str, params: list[Any], session: Any) -> object:
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    parsed = local_rpc.parse(body)
    if isinstance(parsed, bytes):
        raise ApiError(400, "malformed request")
    replies, _ = await endpoint.run(parsed, principal_for(session.account_id))
    reply = replies[0] or {}
    if "error" in reply:
        raise ApiError(400, str(reply["error"].get("message", "refused")))
    return reply.get("result")
