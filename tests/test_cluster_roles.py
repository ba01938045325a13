"""The fair-share rule that spreads single-writer roles over processes (sans-IO)."""

from __future__ import annotations

from chaingate.cluster.roles import (
    STABLE_TICKS,
    STARVED_TICKS,
    RoleKey,
    decide,
    fair_share,
    lock_key,
    role_keys,
)

KEYS = role_keys(["ethereum/devnet"], ("follower", "indexer", "webhooks", "bundler"))


def test_labels_and_lock_keys() -> None:
    key = RoleKey("follower", "ethereum", "devnet")
    assert key.label == "follower:ethereum/devnet"
    assert 0 <= lock_key(key.label, "public") < 2**31
    assert lock_key(key.label, "public") != lock_key(key.label, "other_schema")
    assert len({lock_key(k.label, "public") for k in KEYS}) == len(KEYS)


def test_share() -> None:
    assert fair_share(4, 1) == 4
    assert fair_share(4, 2) == 2
    assert fair_share(5, 2) == 3
    assert fair_share(4, 0) == 4


def test_alone_takes_every_free_role() -> None:
    decision = decide(KEYS, set(), set(), 1, {}, 0)
    assert decision.take == KEYS
    assert decision.release == []


def test_second_process_takes_its_share_only() -> None:
    mine: set[RoleKey] = set()
    others = set(KEYS[:2])
    decision = decide(KEYS, mine, others, 2, {}, 0)
    assert decision.take == KEYS[2:]
    # The first process, at its share of 2 already, takes nothing more.
    assert decide(KEYS, set(KEYS[:2]), set(KEYS[:2]), 2, {}, 0).take == []


def test_above_share_hands_over_one_role_once_members_are_stable() -> None:
    everything = set(KEYS)
    assert decide(KEYS, everything, everything, 2, {}, STABLE_TICKS - 1).release == []
    decision = decide(KEYS, everything, everything, 2, {}, STABLE_TICKS)
    assert decision.release == [KEYS[-1]]  # the last in order: both processes agree on it
    assert decision.take == []


def test_a_role_left_free_too_long_is_taken_beyond_the_share() -> None:
    mine = set(KEYS[:2])
    held = set(KEYS[:2]) | {KEYS[2]}
    ticks = {KEYS[3]: STARVED_TICKS}
    assert decide(KEYS, mine, held, 2, ticks, 0).take == [KEYS[3]]
    assert decide(KEYS, mine, held, 2, {KEYS[3]: STARVED_TICKS - 1}, 0).take == []
