"""HeadJudge (sans-IO): which head is agreed, who lags, who is an outlier — and head parsing.

The integration side (a liar beside a real anvil) is in tests/test_upstream_faults.py; these
pin the rules for cases a two-node test cannot stage: a lone source, a witness, time.
"""

from __future__ import annotations

import pytest

from chaingate.rpc.heads import HeadJudge, parse_evm_head, parse_solana_head, witness_head

BLOCK_TIME = 12.0
SLACK = 10


def judge() -> HeadJudge:
    return HeadJudge(BLOCK_TIME, SLACK)


def test_a_liar_beside_honest_nodes_is_an_outlier_and_moves_nothing() -> None:
    j = judge()
    verdict = j.judge({"liar": 0xFFFFFFFF, "a": 100}, None, now=0.0)
    assert verdict.outliers == {"liar"} and verdict.lags == {"a": 0}
    assert j.head == 100
    verdict = j.judge({"liar": 0xFFFFFFFF, "a": 101, "b": 99}, None, now=1.0)
    assert verdict.outliers == {"liar"} and verdict.lags == {"a": 0, "b": 2}
    assert j.head == 101  # reached by two sources (the liar's claim covers it): no higher


def test_a_lagging_honest_node_is_lagging_not_the_reference() -> None:
    j = judge()
    j.judge({"a": 1000, "b": 1000}, None, now=0.0)
    # b falls far behind (a restart), a keeps going at the chain's pace: a stays plausible,
    # b lags, finality is decided conservatively from the lower agreed head.
    verdict = j.judge({"a": 1010, "b": 400}, None, now=120.0)
    assert verdict.outliers == set()
    assert verdict.lags == {"a": 0, "b": 600}
    assert j.head == 400


def test_two_sources_agreeing_beat_the_clock() -> None:
    j = judge()
    j.judge({"a": 10, "b": 10}, None, now=0.0)
    verdict = j.judge({"a": 5000, "b": 5000}, None, now=0.5)  # anvil_mine on a shared node
    assert verdict.outliers == set() and j.head == 5000


def test_one_source_alone_is_never_accused_but_its_jumps_are_not_believed() -> None:
    j = judge()
    assert j.judge({"only": 100}, None, now=0.0).outliers == set()
    assert j.head == 100
    j.judge({"only": 105}, None, now=1.0)  # within the slack
    assert j.head == 105
    verdict = j.judge({"only": 0xFFFFFFFF}, None, now=2.0)
    assert verdict.outliers == set() and verdict.lags == {"only": 0}
    assert j.head == 105
    # The clock is the witness: a minute later, five more blocks are plausible.
    assert j.ceiling(62.0) == 105 + SLACK + 5
    j.judge({"only": 120}, None, now=62.0)
    assert j.head == 120


def test_the_follower_confirms_or_contradicts_a_lone_upstream() -> None:
    j = judge()
    j.judge({"only": 100}, 100, now=0.0)
    j.judge({"only": 0xFFFFFFFF}, 101, now=1.0)
    assert j.head == 101  # the follower's head, not the liar's
    j.judge({"only": 3000}, 3000, now=2.0)  # a burst the follower confirms
    assert j.head == 3000


def test_a_lone_liar_at_start_up_is_replaced_by_the_first_agreement() -> None:
    j = judge()
    j.judge({"liar": 0xFFFFFFFF}, None, now=0.0)  # nobody else answered yet
    verdict = j.judge({"liar": 0xFFFFFFFF, "honest": 50}, None, now=1.0)
    assert verdict.outliers == {"liar"} and verdict.lags == {"honest": 0}
    assert j.head == 50


def test_a_revert_moves_the_head_back_without_making_everyone_lag() -> None:
    j = judge()
    j.judge({"a": 100, "b": 100}, None, now=0.0)
    verdict = j.judge({"a": 50, "b": 50}, None, now=1.0)
    assert j.head == 50 and verdict.lags == {"a": 0, "b": 0}


def test_heads_seen_in_answers_move_finality_only_as_far_as_the_clock_allows() -> None:
    j = judge()
    j.judge({"a": 100, "b": 100}, None, now=0.0)
    j.note(0xFFFFFFFF, now=1.0)
    j.note(150, now=1.0)
    assert j.head == 100
    j.note(102, now=30.0)  # two block times later
    assert j.head == 102


def test_a_lone_liar_cannot_raise_its_own_ceiling_round_by_round() -> None:
    # Two upstreams agreed; then only the liar answers (the honest node's probes fail), each
    # round claiming the most it may.  It must not climb by the slack every round.
    j = judge()
    j.judge({"liar": 100, "honest": 100}, None, now=0.0)
    for round_ in range(1, 31):
        now = round_ * 2.0
        j.judge({"liar": j.ceiling(now) or 0}, None, now=now)
        assert j.head is not None
        assert j.head <= 100 + SLACK + int(now / BLOCK_TIME), (round_, j.head)


def test_a_stalled_chain_makes_no_far_head_plausible() -> None:
    j = judge()
    j.judge({"a": 100, "b": 100}, None, now=0.0)
    j.judge({"a": 100, "b": 100}, None, now=3600.0)  # an hour without a block, both agree
    j.note(350, now=3601.0)  # one answer claims what an hour of blocks would have made
    assert j.head == 100
    j.judge({"only": 350}, None, now=3602.0)  # nor may a lone source claim it
    assert j.head == 100


@pytest.mark.parametrize(
    ("body", "head"),
    [
        (b'{"jsonrpc":"2.0","id":0,"result":"0x1b4"}', 0x1B4),
        (b'{"jsonrpc":"2.0","id":0,"result":"0xffffffffffffffff"}', (1 << 64) - 1),
        (b'{"jsonrpc":"2.0","id":0,"result":"0x1ffffffffffffffff"}', None),
        (b'{"jsonrpc":"2.0","id":0,"result":"0x' + b"f" * 5000 + b'"}', None),
        (b'{"jsonrpc":"2.0","id":0,"result":"0x"}', None),
        (b'{"jsonrpc":"2.0","id":0,"result":"0xzz"}', None),
        (b'{"jsonrpc":"2.0","id":0,"result":"1b4"}', None),
        (b'{"jsonrpc":"2.0","id":0,"result":436}', None),
        (b'{"jsonrpc":"2.0","id":0,"error":{"code":-1,"message":"x"}}', None),
        (b"<html>bad gateway</html>", None),
    ],
)
def test_evm_heads_are_parsed_with_a_bound(body: bytes, head: int | None) -> None:
    assert parse_evm_head(body) == head


@pytest.mark.parametrize(
    ("body", "slot"),
    [
        (b'{"result":436}', 436),
        (b'{"result":18446744073709551615}', (1 << 64) - 1),
        (b'{"result":18446744073709551616}', None),
        (b'{"result":' + b"9" * 5000 + b"}", None),
        (b'{"result":-1}', None),
        (b'{"result":true}', None),
        (b'{"result":"436"}', None),
    ],
)
def test_solana_slots_are_parsed_with_a_bound(body: bytes, slot: int | None) -> None:
    assert parse_solana_head(body) == slot


class _Header:
    def __init__(self, number: object) -> None:
        self.number = number


class _Follower:
    def __init__(self, number: object, live: bool = True) -> None:
        self.head = _Header(number)
        self.live = live


def test_a_witness_head_is_used_only_when_live_and_sane() -> None:
    assert witness_head(_Follower(7)) == 7  # type: ignore[arg-type]
    assert witness_head(_Follower(7, live=False)) is None  # type: ignore[arg-type]
    assert witness_head(_Follower(1 << 70)) is None  # type: ignore[arg-type]
    assert witness_head(None) is None
