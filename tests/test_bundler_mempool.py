"""The bundler's mempool and ERC-7562 reputation, sans-IO: every admission rule, bundle
selection and lifecycle move, the reputation formula, decay on an injected clock."""

from __future__ import annotations

import pytest

from chaingate.aa.userop import UserOperation, Version, user_op_hash
from chaingate.bundler.errors import (
    BANNED_OPCODE,
    INVALID_PARAMS,
    PAYMASTER_BALANCE,
    STAKE_TOO_LOW,
    THROTTLED,
    TIME_RANGE,
    BundlerFault,
)
from chaingate.bundler.mempool import (
    Entry,
    Mempool,
    MempoolLimits,
    Stake,
    effective_tip,
    max_cost,
    new_entry,
    op_gas,
)
from chaingate.bundler.reputation import (
    BAN_OPS_SEEN_PENALTY,
    CLIENT_PARAMS,
    Reputation,
    ReputationEntry,
)

EP = "0x0000000071727De22E5E9d8BAf0edAc6f37da032"
GWEI = 10**9
MIN_STAKE = 10**18
STAKED = Stake(MIN_STAKE, 86400)
T0_MS = 1_700_000_000_000


class Clock:
    """Milliseconds, moved by the test; ``s`` is the same instant in seconds."""

    def __init__(self) -> None:
        self.ms = T0_MS

    def __call__(self) -> int:
        return self.ms

    def s(self) -> float:
        return self.ms / 1000

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


def addr(n: int) -> str:
    return "0x" + f"{n:040x}"


def make_op(
    sender: str = addr(0xA1),
    nonce: int = 0,
    *,
    fee: int = 20 * GWEI,
    tip: int = 2 * GWEI,
    factory: str | None = None,
    paymaster: str | None = None,
    call_gas: int = 100_000,
    data: bytes = b"\x01\x02",
) -> UserOperation:
    return UserOperation(
        sender=sender,
        nonce=nonce,
        call_data=data,
        call_gas_limit=call_gas,
        verification_gas_limit=150_000,
        pre_verification_gas=50_000,
        max_fee_per_gas=fee,
        max_priority_fee_per_gas=tip,
        signature=b"\x55" * 65,
        factory=factory,
        factory_data=b"\x00" if factory else b"",
        paymaster=paymaster,
        paymaster_verification_gas_limit=60_000 if paymaster else 0,
        paymaster_post_op_gas_limit=10_000 if paymaster else 0,
    )


class Pool:
    """A mempool, its reputation and clock, and a helper to build entries for it."""

    def __init__(self, limits: MempoolLimits | None = None) -> None:
        self.clock = Clock()
        self.rep = Reputation(min_stake=MIN_STAKE, clock=self.clock.s)
        self.pool = Mempool(self.rep, limits, clock=self.clock)

    def entry(self, op: UserOperation, *, version: Version = "0.7", **validation: object) -> Entry:
        return self._entry(op, version, validation)

    def add(self, op: UserOperation, **validation: object) -> Entry:
        return self.pool.add(self._entry(op, "0.7", validation)).entry

    def _entry(self, op: UserOperation, version: Version, validation: dict[str, object]) -> Entry:
        digest = user_op_hash(op, entry_point=EP, chain_id=31337, version=version)
        return new_entry(
            op,
            user_op_hash=digest,
            entry_point=EP,
            version=version,
            now_ms=self.clock(),
            **validation,
        )


def refused(fault: pytest.ExceptionInfo[BundlerFault]) -> tuple[int, str]:
    return fault.value.code, fault.value.message


# --- replacement -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fee_pct", "tip_pct"),
    [(109, 109), (110, 100), (100, 110), (100, 100), (90, 90), (200, 109)],
)
def test_replacement_below_ten_percent_on_either_fee_is_refused(fee_pct: int, tip_pct: int) -> None:
    p = Pool()
    first = p.add(make_op(fee=100 * GWEI, tip=10 * GWEI))
    again = make_op(fee=100 * GWEI * fee_pct // 100, tip=10 * GWEI * tip_pct // 100, data=b"\x02")
    with pytest.raises(BundlerFault) as fault:
        p.add(again)
    code, message = refused(fault)
    assert code == INVALID_PARAMS
    assert "replacement underpriced" in message
    assert [e.hash for e in p.pool.entries()] == [first.hash]


@pytest.mark.parametrize("pct", [110, 111, 300])
def test_replacement_at_or_above_ten_percent_replaces_in_place(pct: int) -> None:
    p = Pool()
    first = p.add(make_op(nonce=0, fee=100 * GWEI, tip=10 * GWEI))
    other = p.add(make_op(nonce=1))
    result = p.pool.add(
        p.entry(make_op(nonce=0, fee=100 * GWEI * pct // 100, tip=GWEI * pct // 10))
    )
    assert result.replaced is not None and result.replaced.hash == first.hash
    assert (result.replaced.status, result.replaced.reason) == (
        "dropped",
        f"replaced by {result.entry.hash}",
    )
    assert first.hash not in p.pool and p.pool.get(first.hash) == result.replaced
    # The replacement keeps its predecessor's place in arrival order, as the reference does.
    assert [e.hash for e in p.pool.entries()] == [result.entry.hash, other.hash]
    assert len(p.pool.by_sender(addr(0xA1))) == 2


def test_an_operation_in_a_bundle_being_submitted_cannot_be_replaced() -> None:
    p = Pool()
    first = p.add(make_op())
    p.pool.mark_submitted([first.hash], "0x" + "ab" * 32)
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(fee=100 * GWEI, tip=50 * GWEI))
    assert fault.value.code == INVALID_PARAMS
    assert "bundle" in fault.value.message


def test_a_refused_replacement_leaves_the_old_operation_in_place() -> None:
    p = Pool()
    first = p.add(make_op(fee=100 * GWEI, tip=10 * GWEI))
    p.rep.set_reputation([ReputationEntry(addr(0xFF), 100_000, 0)])  # a banned paymaster
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(fee=200 * GWEI, tip=20 * GWEI, paymaster=addr(0xFF)))
    assert fault.value.code == THROTTLED
    assert p.pool.get(first.hash) == first
    assert p.pool.by_sender(addr(0xA1)) == [first]


# --- per-sender and per-entity limits --------------------------------------------------------


def test_fifth_operation_of_an_unstaked_sender_is_refused() -> None:
    p = Pool()
    for nonce in range(4):
        p.add(make_op(nonce=nonce))
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(nonce=4))
    code, message = refused(fault)
    assert code == STAKE_TOO_LOW  # the bundler spec tests' -32505 "... is unstaked"
    assert "unstaked" in message and addr(0xA1) in message
    assert len(p.pool) == 4
    # Other nonce keys count too: the limit is per sender.
    with pytest.raises(BundlerFault):
        p.add(make_op(nonce=1 << 64))


def test_a_staked_sender_may_hold_more_but_is_still_bounded() -> None:
    p = Pool(MempoolLimits(staked_entity_max=6))
    for nonce in range(6):
        p.add(make_op(nonce=nonce), sender_stake=STAKED)
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(nonce=6), sender_stake=STAKED)
    assert fault.value.code == THROTTLED
    # A stake below the minimum is no stake.
    q = Pool()
    for nonce in range(4):
        q.add(make_op(nonce=nonce), sender_stake=Stake(MIN_STAKE - 1, 86400))
    with pytest.raises(BundlerFault) as low:
        q.add(make_op(nonce=4), sender_stake=Stake(MIN_STAKE - 1, 86400))
    assert low.value.code == STAKE_TOO_LOW


def test_unstaked_paymaster_gets_its_urep_020_allowance() -> None:
    p = Pool()
    pm = addr(0xBB)
    for i in range(10):  # SAME_UNSTAKED_ENTITY_MEMPOOL_COUNT, no inclusions yet
        p.add(make_op(sender=addr(0x100 + i), paymaster=pm))
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(sender=addr(0x200), paymaster=pm))
    code, message = refused(fault)
    assert code == STAKE_TOO_LOW and "paymaster" in message and pm in message
    # The same paymaster, staked, is not limited by that allowance.
    p.add(make_op(sender=addr(0x201), paymaster=pm), paymaster_stake=STAKED)


def test_urep_020_allowance_grows_with_inclusions() -> None:
    rep = Reputation(min_stake=MIN_STAKE, clock=lambda: 0.0)
    pm = addr(0xBB)
    assert rep.max_mempool_ops_unstaked("paymaster", pm) == 10
    rep.set_reputation([ReputationEntry(pm, 10, 1)])  # the spec tests' "unstaked" entity
    assert rep.max_mempool_ops_unstaked("paymaster", pm) == 12
    rep.set_reputation([ReputationEntry(pm, 20, 20)])
    assert rep.max_mempool_ops_unstaked("paymaster", pm) == 10 + 10 + 20
    assert rep.max_mempool_ops_unstaked("account", pm) == 4


def test_throttled_entity_may_hold_four_operations() -> None:
    p = Pool()
    factory = addr(0xFA)
    p.rep.set_reputation([ReputationEntry(factory, 120, 1)])  # 12 > 1 + 10: throttled
    assert p.rep.status(factory) == "throttled"
    for i in range(4):
        p.add(make_op(sender=addr(0x300 + i), factory=factory))
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(sender=addr(0x310), factory=factory))
    code, message = refused(fault)
    assert code == THROTTLED and "throttled" in message and factory in message


def test_banned_entity_is_refused_outright() -> None:
    p = Pool()
    p.rep.set_reputation([ReputationEntry(addr(0xA1), 100_000, 1)])
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op())
    code, message = refused(fault)
    assert code == THROTTLED and "banned" in message


def test_sender_and_entity_roles_do_not_mix_sto_040() -> None:
    p = Pool()
    both = addr(0xCC)
    p.add(make_op(sender=both))
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(sender=addr(0xD1), paymaster=both))
    assert fault.value.code == BANNED_OPCODE
    assert "is used as a sender entity in another UserOperation" in fault.value.message

    q = Pool()
    q.add(make_op(sender=addr(0xD1), factory=both))
    with pytest.raises(BundlerFault) as other:
        q.add(make_op(sender=both))
    assert other.value.code == BANNED_OPCODE
    assert "is used as a different entity in another UserOperation" in other.value.message


# --- dedupe, expiry, size bound ----------------------------------------------------------------


def test_the_same_operation_twice_is_already_known() -> None:
    p = Pool()
    e = p.entry(make_op())
    p.pool.add(e)
    with pytest.raises(BundlerFault) as fault:
        p.pool.add(e)
    assert fault.value.code == INVALID_PARAMS and "already known" in fault.value.message
    assert len(p.pool) == 1


def test_an_operation_expiring_within_the_margin_is_refused() -> None:
    p = Pool(MempoolLimits(expiry_margin_s=30))
    now_s = p.clock() // 1000
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(), valid_until=now_s + 30)
    assert fault.value.code == TIME_RANGE
    kept = p.add(make_op(), valid_until=now_s + 31)
    assert kept.hash in p.pool


def test_expire_drops_pending_operations_past_their_valid_until() -> None:
    p = Pool(MempoolLimits(expiry_margin_s=30))
    now_s = p.clock() // 1000
    short = p.add(make_op(sender=addr(1)), valid_until=now_s + 100)
    forever = p.add(make_op(sender=addr(2)))
    in_bundle = p.add(make_op(sender=addr(3)), valid_until=now_s + 100)
    p.pool.mark_submitted([in_bundle.hash], "0x" + "01" * 32)
    p.clock.advance(69)
    assert p.pool.expire() == []
    p.clock.advance(1)
    gone = p.pool.expire()
    assert [(e.hash, e.status, e.reason) for e in gone] == [(short.hash, "dropped", "expired")]
    assert forever.hash in p.pool and in_bundle.hash in p.pool  # a bundle decides its fate
    assert p.pool.get(short.hash) is not None  # still found among the recently finished


def test_throttled_entity_operations_live_ten_blocks() -> None:
    p = Pool()
    pm = addr(0xBB)
    e = p.add(make_op(paymaster=pm), accepted_block=100)
    p.rep.set_reputation([ReputationEntry(pm, 120, 1)])
    assert p.pool.expire(block_number=110) == []
    assert [x.hash for x in p.pool.expire(block_number=111)] == [e.hash]


def test_a_full_pool_evicts_its_cheapest_pending_operation_or_refuses() -> None:
    p = Pool(MempoolLimits(max_size=3))
    cheap = p.add(make_op(sender=addr(1), tip=1 * GWEI))
    busy = p.add(make_op(sender=addr(2), tip=GWEI // 2))
    p.pool.mark_submitted([busy.hash], "0x" + "02" * 32)  # cheapest, but in a bundle
    p.add(make_op(sender=addr(3), tip=3 * GWEI))
    with pytest.raises(BundlerFault) as fault:
        p.add(make_op(sender=addr(4), tip=1 * GWEI))  # does not outbid the cheapest
    assert fault.value.code == THROTTLED and "full" in fault.value.message
    added = p.pool.add(p.entry(make_op(sender=addr(5), tip=5 * GWEI)))
    assert [(e.hash, e.status) for e in added.evicted] == [(cheap.hash, "dropped")]
    assert len(p.pool) == 3 and busy.hash in p.pool


# --- bundles -----------------------------------------------------------------------------------


def test_bundle_takes_the_highest_effective_tip_first() -> None:
    p = Pool()
    # At base fee 15 gwei: a tip of 8 capped at 20-15 = 5; 4 stays 4; a max fee of 14 cannot pay.
    capped = p.add(make_op(sender=addr(1), fee=20 * GWEI, tip=8 * GWEI))
    plain = p.add(make_op(sender=addr(2), fee=100 * GWEI, tip=4 * GWEI))
    rich = p.add(make_op(sender=addr(3), fee=100 * GWEI, tip=6 * GWEI))
    p.add(make_op(sender=addr(4), fee=14 * GWEI, tip=4 * GWEI))
    assert effective_tip(capped, 15 * GWEI) == 5 * GWEI
    chosen = p.pool.select_bundle(base_fee=15 * GWEI, max_gas=10**8).entries
    assert [e.hash for e in chosen] == [rich.hash, capped.hash, plain.hash]
    # Selecting changes nothing until the bundle is submitted.
    assert all(e.status == "pending" for e in p.pool.entries())


def test_bundle_keeps_nonce_order_and_one_operation_per_sender() -> None:
    p = Pool()
    key1 = 1 << 64
    n1 = p.add(make_op(nonce=1, tip=9 * GWEI))
    n0 = p.add(make_op(nonce=0, tip=1 * GWEI))
    k1 = p.add(make_op(nonce=key1, tip=3 * GWEI))
    first = p.pool.select_bundle(base_fee=0, max_gas=10**8).entries
    # Heads are nonce 0 (key 0) and key1's 0; the better-paying head goes, alone.
    assert [e.hash for e in first] == [k1.hash]
    p.pool.mark_submitted([k1.hash], "0x" + "03" * 32)
    # With an operation of this sender in flight, none of its others is bundled.
    assert p.pool.select_bundle(base_fee=0, max_gas=10**8).entries == ()
    p.pool.mark_included(
        k1.hash, block_number=5, block_hash="0x" + "04" * 32, tx_hash="0x" + "03" * 32
    )
    assert [e.hash for e in p.pool.select_bundle(base_fee=0, max_gas=10**8).entries] == [n0.hash]
    p.pool.mark_submitted([n0.hash], "0x" + "05" * 32)
    p.pool.mark_included(
        n0.hash, block_number=6, block_hash="0x" + "06" * 32, tx_hash="0x" + "05" * 32
    )
    assert [e.hash for e in p.pool.select_bundle(base_fee=0, max_gas=10**8).entries] == [n1.hash]


def test_bundle_respects_the_gas_cap_and_op_count() -> None:
    p = Pool()
    big = p.add(make_op(sender=addr(1), tip=9 * GWEI, call_gas=1_000_000))
    small = p.add(make_op(sender=addr(2), tip=1 * GWEI))
    assert op_gas(small) == 50_000 + 150_000 + 100_000
    chosen = p.pool.select_bundle(base_fee=0, max_gas=op_gas(small) + 10).entries
    assert [e.hash for e in chosen] == [small.hash]  # the big one does not fit; the small does
    both = p.pool.select_bundle(base_fee=0, max_gas=op_gas(big) + op_gas(small)).entries
    assert {e.hash for e in both} == {big.hash, small.hash}
    assert len(p.pool.select_bundle(base_fee=0, max_gas=10**8, max_ops=1).entries) == 1


def test_v06_paymaster_triples_verification_gas() -> None:
    p = Pool()
    op = make_op(paymaster=addr(0xBB))
    e = p.entry(op, version="0.6")
    assert op_gas(e) == 50_000 + 3 * 150_000 + 100_000
    e7 = p.entry(op, version="0.7")
    assert op_gas(e7) == 50_000 + 150_000 + 100_000 + 60_000 + 10_000


def test_bundle_limits_throttled_entities_and_drops_banned_ones() -> None:
    p = Pool()
    pm, bad = addr(0xBB), addr(0xBD)
    for i in range(4):
        p.add(make_op(sender=addr(0x400 + i), paymaster=pm))
    p.add(make_op(sender=addr(0x404), paymaster=pm), paymaster_stake=STAKED)
    doomed = p.add(make_op(sender=addr(0x500), paymaster=bad))
    p.rep.set_reputation([ReputationEntry(pm, 130, 1), ReputationEntry(bad, 100_000, 0)])
    selection = p.pool.select_bundle(base_fee=0, max_gas=10**8)
    assert len(selection.entries) == 4  # THROTTLED_ENTITY_BUNDLE_COUNT
    assert all(e.paymaster == pm for e in selection.entries)
    assert [(e.hash, e.status) for e in selection.dropped] == [(doomed.hash, "dropped")]
    assert doomed.hash not in p.pool


def test_bundle_of_one_entry_point_and_only_valid_operations() -> None:
    p = Pool()
    later = p.add(make_op(sender=addr(1)), valid_after=p.clock() // 1000 + 60)
    now = p.add(make_op(sender=addr(2)))
    chosen = p.pool.select_bundle(base_fee=0, max_gas=10**8, entry_point=EP.lower()).entries
    assert [e.hash for e in chosen] == [now.hash]
    assert p.pool.select_bundle(base_fee=0, max_gas=10**8, entry_point=addr(9)).entries == ()
    p.clock.advance(60)
    assert {e.hash for e in p.pool.select_bundle(base_fee=0, max_gas=10**8).entries} == {
        later.hash,
        now.hash,
    }


# --- lifecycle ---------------------------------------------------------------------------------


def test_lifecycle_submitted_included_and_lookups() -> None:
    p = Pool()
    pm = addr(0xBB)
    e = p.add(make_op(paymaster=pm))
    stale = p.add(make_op(nonce=0 + (0 << 64), sender=addr(0xA2)))
    assert p.rep.entry(pm).ops_seen == 1
    tx = "0x" + "AB" * 32
    (sub,) = p.pool.mark_submitted([e.hash], tx)
    assert (sub.status, sub.bundle_tx) == ("submitted", tx.lower())
    assert p.pool.by_sender(addr(0xA1).upper().replace("0X", "0x")) == [sub]
    done, dropped = p.pool.mark_included(
        e.hash, block_number=7, block_hash="0x" + "cd" * 32, tx_hash=tx
    )
    assert done is not None and done.status == "included" and done.block_number == 7
    assert dropped == []
    assert e.hash not in p.pool and p.pool.get(e.hash) == done
    assert p.rep.entry(pm).ops_included == 1
    assert p.pool.by_sender(addr(0xA1)) == []
    assert stale.hash in p.pool


def test_inclusion_drops_the_senders_stale_operations() -> None:
    p = Pool()
    low = p.add(make_op(nonce=3))
    other_key = p.add(make_op(nonce=(1 << 64) + 1))
    high = p.add(make_op(nonce=5))
    # Another bundler included nonce 4 (not in our pool): nothing to mark.
    assert p.pool.mark_included(
        "0x" + "ee" * 32, block_number=1, block_hash="0x" + "01" * 32, tx_hash="0x" + "02" * 32
    ) == (None, [])
    four = p.add(make_op(nonce=4))
    done, stale = p.pool.mark_included(
        four.hash, block_number=1, block_hash="0x" + "01" * 32, tx_hash="0x" + "02" * 32
    )
    assert done is not None
    assert [(s.hash, s.status) for s in stale] == [(low.hash, "dropped")]
    assert {e.hash for e in p.pool.entries()} == {other_key.hash, high.hash}


def test_requeue_revert_fail_and_drop() -> None:
    p = Pool()
    a = p.add(make_op(sender=addr(1)))
    b = p.add(make_op(sender=addr(2)))
    p.pool.mark_submitted([a.hash, b.hash], "0x" + "01" * 32)
    (back,) = p.pool.requeue([a.hash], "bundle dropped")
    assert (back.status, back.bundle_tx, back.reason) == ("pending", None, "bundle dropped")
    p.pool.mark_included(
        b.hash, block_number=9, block_hash="0x" + "09" * 32, tx_hash="0x" + "01" * 32
    )
    again = p.pool.revert_inclusion(b.hash)
    assert again is not None and again.status == "pending" and again.block_hash is None
    assert b.hash in p.pool
    failed = p.pool.mark_failed(b.hash, "AA25 invalid account nonce")
    assert failed is not None and failed.status == "failed"
    assert p.pool.revert_inclusion(b.hash) is None  # only an included one comes back
    dropped = p.pool.drop(a.hash, "by request")
    assert dropped is not None and len(p.pool) == 0


def test_drop_entity_removes_every_operation_naming_it() -> None:
    p = Pool()
    fac = addr(0xFA)
    x = p.add(make_op(sender=addr(1), factory=fac))
    p.add(make_op(sender=addr(2)))
    assert [e.hash for e in p.pool.drop_entity(fac.upper().replace("0X", "0x"))] == [x.hash]
    assert len(p.pool) == 1


def test_load_restores_live_entries_and_their_indexes() -> None:
    p = Pool()
    a = p.add(make_op(sender=addr(1), paymaster=addr(0xBB)))
    p.clock.advance(1)
    b = p.add(make_op(sender=addr(2)))
    (b_sub,) = p.pool.mark_submitted([b.hash], "0x" + "01" * 32)
    fresh = Pool()
    assert fresh.pool.load([b_sub, a, a]) == 2
    assert [e.hash for e in fresh.pool.entries()] == [a.hash, b.hash]
    assert fresh.pool.get(b.hash) == b_sub
    # The loaded entries count for the rules: addr(1) cannot now be a factory elsewhere.
    with pytest.raises(BundlerFault):
        fresh.add(make_op(sender=addr(3), factory=addr(1)))


def test_clear_drops_pending_and_keeps_what_is_in_flight() -> None:
    p = Pool()
    a = p.add(make_op(sender=addr(1)))
    b = p.add(make_op(sender=addr(2)))
    p.pool.mark_submitted([b.hash], "0x" + "01" * 32)
    assert [e.hash for e in p.pool.clear()] == [a.hash]
    assert [e.hash for e in p.pool.entries()] == [b.hash]


def test_finished_entries_kept_for_lookups_are_bounded() -> None:
    p = Pool(MempoolLimits(max_finals=2))
    hashes = [p.add(make_op(sender=addr(i))).hash for i in range(1, 4)]
    for h in hashes:
        p.pool.drop(h, "x")
    assert p.pool.get(hashes[0]) is None
    assert p.pool.get(hashes[2]) is not None


# --- reputation ------------------------------------------------------------------------------


def test_reputation_status_formula_boundaries() -> None:
    rep = Reputation(min_stake=MIN_STAKE, clock=lambda: 0.0)
    x = addr(0x77)
    assert rep.status(x) == "ok" and rep.status(None) == "ok"
    # max_seen = seen // 10; throttled when max_seen > included + 10, banned when > included + 50.
    for seen, included, status in [
        (109, 0, "ok"),
        (110, 0, "throttled"),
        (120, 1, "throttled"),  # the spec tests' "throttled" entity
        (509, 0, "throttled"),
        (510, 0, "banned"),
        (510, 1, "throttled"),
        (1000, 100, "ok"),
    ]:
        rep.set_reputation([ReputationEntry(x, seen, included)])
        assert rep.status(x) == status, (seen, included)
    client = Reputation(CLIENT_PARAMS, min_stake=MIN_STAKE, clock=lambda: 0.0)
    client.set_reputation([ReputationEntry(x, 1099, 0)])
    assert client.status(x) == "ok"
    client.set_reputation([ReputationEntry(x, 1100, 0)])
    assert client.status(x) == "throttled"


def test_reputation_seen_and_throttling_by_counting() -> None:
    rep = Reputation(min_stake=MIN_STAKE, clock=lambda: 0.0)
    pm = addr(0xBB)
    for _ in range(109):
        rep.seen(pm)
    assert rep.status(pm) == "ok"
    rep.seen(pm)
    assert rep.status(pm) == "throttled"
    rep.included(pm)
    assert rep.status(pm) == "ok"
    rep.seen(pm, -1000)
    assert rep.entry(pm).ops_seen == 0


def test_crashed_handle_ops_bans_the_entity() -> None:
    rep = Reputation(min_stake=MIN_STAKE, clock=lambda: 0.0)
    pm = addr(0xBB)
    rep.set_reputation([ReputationEntry(pm, 5, 5)])
    rep.crashed_handle_ops(pm)
    assert rep.entry(pm) == ReputationEntry(pm, 5 + BAN_OPS_SEEN_PENALTY, 0)
    assert rep.status(pm) == "banned"
    with pytest.raises(BundlerFault) as fault:
        rep.check_entity("paymaster", pm)
    assert fault.value.code == THROTTLED and fault.value.data == {"paymaster": pm}


def test_reputation_decays_hourly_on_the_injected_clock() -> None:
    clock = Clock()
    rep = Reputation(min_stake=MIN_STAKE, clock=clock.s)
    x, y = addr(1), addr(2)
    rep.set_reputation([ReputationEntry(x, 240, 48), ReputationEntry(y, 1, 0)])
    clock.advance(3599)
    assert rep.tick() == 0 and rep.entry(x).ops_seen == 240
    clock.advance(1)
    assert rep.tick() == 1
    assert rep.entry(x) == ReputationEntry(x, 230, 46)
    assert len(rep) == 1  # y decayed to zero and is forgotten
    clock.advance(3 * 3600 + 10)
    assert rep.tick() == 3
    seen, included = 230, 46
    for _ in range(3):
        seen, included = seen * 23 // 24, included * 23 // 24
    assert rep.entry(x) == ReputationEntry(x, seen, included)
    # A banned entity is pardoned by time: about 4 days to 1%.
    rep.crashed_handle_ops(x)
    assert rep.status(x) == "banned"
    clock.advance(200 * 3600)
    rep.tick()
    assert rep.status(x) == "ok"
    clock.advance(10_000 * 3600)
    rep.tick()
    assert len(rep) == 0


def test_stake_checks() -> None:
    rep = Reputation(min_stake=MIN_STAKE, min_unstake_delay=86400, clock=lambda: 0.0)
    pm = addr(0xBB)
    rep.check_stake("paymaster", pm, MIN_STAKE, 86400)
    assert rep.is_staked(MIN_STAKE, 86400) and not rep.is_staked(MIN_STAKE, 86399)
    with pytest.raises(BundlerFault) as none:
        rep.check_stake("paymaster", pm, 0, 86400)
    assert none.value.code == STAKE_TOO_LOW and "is unstaked" in none.value.message
    with pytest.raises(BundlerFault) as delay:
        rep.check_stake("factory", pm, MIN_STAKE, 10)
    assert delay.value.code == STAKE_TOO_LOW and "unstake delay" in delay.value.message
    listed = Reputation(min_stake=MIN_STAKE, clock=lambda: 0.0, whitelist=[pm.upper()[2:]])
    listed.check_stake("paymaster", pm[2:], 0, 0)


def test_reputation_lists_bound_and_changes() -> None:
    rep = Reputation(
        min_stake=MIN_STAKE, clock=lambda: 0.0, max_entries=10, blacklist=[addr(0xDEAD)]
    )
    assert rep.status(addr(0xDEAD)) == "banned"
    rep.set_reputation([ReputationEntry(addr(0xB0), 100_000, 0)])  # banned: never forgotten
    for i in range(40):
        rep.seen(addr(0x1000 + i))
    assert len(rep) <= 10
    assert rep.status(addr(0xB0)) == "banned"
    upserts, deletes = rep.take_changes()
    assert {e.address for e in upserts} == {e.address for e, _ in rep.dump()}
    assert deletes and all(a not in {e.address for e in upserts} for a in deletes)
    assert rep.take_changes() == ([], [])
    rep.clear()
    assert len(rep) == 0 and rep.dump() == []
    with pytest.raises(ValueError, match="negative"):
        rep.set_reputation([ReputationEntry(addr(1), -1, 0)])


def test_forget_undoes_an_add_the_store_could_not_keep() -> None:
    p = Pool(MempoolLimits(max_size=2))
    pm = addr(0xBB)
    old = p.add(make_op(sender=addr(1), fee=100 * GWEI, tip=10 * GWEI, paymaster=pm))
    cheap = p.add(make_op(sender=addr(2), tip=1))
    before = p.pool.entries()
    seen = p.rep.entry(pm).ops_seen
    added = p.pool.add(p.entry(make_op(sender=addr(1), fee=200 * GWEI, tip=20 * GWEI, data=b"x")))
    assert added.replaced is not None
    p.pool.forget(added)
    assert p.pool.entries() == before and p.pool.by_sender(addr(1)) == [old]
    evicting = p.pool.add(p.entry(make_op(sender=addr(3), tip=50 * GWEI, paymaster=pm)))
    assert [e.hash for e in evicting.evicted] == [cheap.hash]
    p.pool.forget(evicting)
    assert {e.hash for e in p.pool.entries()} == {old.hash, cheap.hash}
    assert p.rep.entry(pm).ops_seen == seen
    assert p.pool.has_pending()
    p.pool.mark_submitted([old.hash, cheap.hash], "0x" + "01" * 32)
    assert not p.pool.has_pending()


def test_valid_until_zero_means_no_limit() -> None:
    p = Pool()
    e = p.add(make_op(), valid_until=0)
    p.clock.advance(10**6)
    assert p.pool.expire() == [] and e.hash in p.pool


# --- EREP-010, STO-041, the precheck (issue 20 and 25) -----------------------------------------


def test_a_paymaster_deposit_covers_all_its_live_operations() -> None:
    p = Pool()
    pm = addr(0x99)
    ops = [make_op(addr(0xB0 + i), paymaster=pm) for i in range(3)]
    cost = max_cost(p.entry(ops[0]))
    deposit = 3 * cost - 1
    for op in ops[:2]:
        p.pool.add(p.entry(op), paymaster_deposit=deposit)
    assert p.pool.paymaster_pending_cost(pm, (addr(0), 0)) == 2 * cost
    with pytest.raises(BundlerFault) as fault:
        p.pool.add(p.entry(ops[2]), paymaster_deposit=deposit)
    code, message = refused(fault)
    assert code == PAYMASTER_BALANCE and "too low" in message and "EREP-010" in message
    # A replacement frees its predecessor's share; a finished operation frees its own.
    bumped = make_op(addr(0xB1), paymaster=pm, fee=22 * GWEI, tip=3 * GWEI)
    assert p.pool.paymaster_pending_cost(pm, (addr(0xB1), 0)) == cost
    p.pool.add(p.entry(bumped), paymaster_deposit=deposit)
    first = p.entry(ops[0])
    p.pool.mark_failed(first.hash, "AA23")
    assert p.pool.paymaster_pending_cost(pm, (addr(0), 0)) == max_cost(p.entry(bumped))
    p.pool.add(p.entry(ops[2]), paymaster_deposit=deposit)


def test_an_operation_touching_a_bundled_senders_storage_waits() -> None:
    p = Pool()
    token, other, third = addr(0xC1), addr(0xC2), addr(0xC3)
    first = p.add(make_op(token))
    second = p.add(make_op(other), storage=(token,))  # read token's storage in validation
    unrelated = p.add(make_op(third), storage=(addr(0xDD),))
    chosen = p.pool.select_bundle(base_fee=GWEI, max_gas=10**8)
    assert [e.hash for e in chosen.entries] == [first.hash, unrelated.hash]
    assert not chosen.dropped and p.pool.get(second.hash).status == "pending"  # type: ignore[union-attr]
    # Alone (its neighbour gone), it is bundled.
    p.pool.mark_failed(first.hash, "gone")
    again = p.pool.select_bundle(base_fee=GWEI, max_gas=10**8)
    assert second.hash in [e.hash for e in again.entries]


def test_precheck_refuses_what_needs_no_validation_and_changes_nothing() -> None:
    p = Pool()
    sender = addr(0xE1)
    added = [p.add(make_op(sender, nonce=key << 64)) for key in range(4)]
    before = p.pool.entries()
    with pytest.raises(BundlerFault) as fault:
        p.pool.precheck(p.entry(make_op(sender, nonce=4 << 64)))
    assert refused(fault)[0] == STAKE_TOO_LOW and "unstaked" in refused(fault)[1]
    with pytest.raises(BundlerFault) as fault:
        p.pool.precheck(p.entry(make_op(sender, nonce=0)))
    assert "already known" in refused(fault)[1]
    cheap = make_op(sender, nonce=0, data=b"\x09")  # same slot, same fees: underpriced
    with pytest.raises(BundlerFault) as fault:
        p.pool.precheck(p.entry(cheap))
    assert "underpriced" in refused(fault)[1]
    # A replacement of one of its four is no fifth operation.
    p.pool.precheck(p.entry(make_op(sender, nonce=0, fee=30 * GWEI, tip=3 * GWEI)))
    # A staked sender (as its operations recorded) may have more.
    rich = addr(0xE2)
    for key in range(4):
        p.add(make_op(rich, nonce=key << 64), sender_stake=STAKED)
    p.pool.precheck(p.entry(make_op(rich, nonce=4 << 64)))
    assert p.pool.entries()[: len(before)] == before and len(added) == 4


@pytest.mark.parametrize("role", ["factory", "paymaster"])
def test_precheck_judges_an_entity_by_the_highest_stake_its_live_operations_recorded(
    role: str,
) -> None:
    p = Pool()
    entity = addr(0xFB)
    stake_field = f"{role}_stake"
    ops = [make_op(sender=addr(0x400 + i), **{role: entity}) for i in range(10)]
    added = [p.add(op) for op in ops[:9]]
    staked = p.add(ops[9], **{stake_field: STAKED})  # one of ten recorded a stake
    p.pool.precheck(p.entry(make_op(sender=addr(0x4FF), **{role: entity})))  # an eleventh
    p.pool.drop(staked.hash, "gone")  # the staked one leaves: ten unstaked would be the limit
    p.add(make_op(sender=addr(0x40A), **{role: entity}))
    with pytest.raises(BundlerFault) as fault:
        p.pool.precheck(p.entry(make_op(sender=addr(0x4FF), **{role: entity})))
    assert refused(fault)[0] == STAKE_TOO_LOW
    for entry in added:
        p.pool.drop(entry.hash, "gone")
    p.pool.precheck(p.entry(make_op(sender=addr(0x4FF), **{role: entity})))
