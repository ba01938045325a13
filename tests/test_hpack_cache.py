"""The memoised HPACK codec of the HTTP/2 upstream connection, judged by the ``hpack`` library's
own decoder and encoder (chaingate's codec never grades itself)."""

from __future__ import annotations

from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hypothesis import given
from hypothesis import strategies as st

from chaingate.rpc.hpack_cache import MEMO_ENTRIES, MemoDecoder, StaticEncoder

names = st.one_of(
    st.sampled_from([b":authority", b":path", b"content-type", b"content-length", b"x-api-key"]),
    st.binary(min_size=1, max_size=300).map(lambda b: b.lower()),
)
fields = st.lists(st.tuples(names, st.binary(max_size=300)), max_size=12)


@given(st.lists(fields, min_size=1, max_size=4))
def test_every_block_decodes_to_its_headers_and_leaves_the_table_empty(
    blocks: list[list[tuple[bytes, bytes]]],
) -> None:
    encoder, decoder = StaticEncoder(), Decoder()
    for headers in blocks + blocks:  # the second time from the memo
        assert decoder.decode(encoder.encode(headers), raw=True) == headers
        assert not decoder.header_table.dynamic_entries
    assert decoder.header_table.maxsize == 0  # the first block said: no dynamic table


def test_request_headers_use_the_static_table() -> None:
    block = StaticEncoder().encode([(b":method", b"POST"), (b":scheme", b"https")])
    assert block == b"\x20\x83\x87"  # size update 0, then indexed 3 and 7


def test_a_block_that_never_touches_the_table_is_decoded_once() -> None:
    # nginx's way: Huffman-coded literals never added to the table (from hpack's encoder).
    server = Encoder()
    headers = [
        NeverIndexedHeaderTuple(b":status", b"200"),
        NeverIndexedHeaderTuple(b"server", b"nginx"),
    ]
    block = server.encode(headers, huffman=True)
    server_headers = Decoder().decode(block, raw=True)
    decoder = MemoDecoder(65536)
    first = decoder.decode(block, raw=True)
    assert first == server_headers
    assert decoder.decode(block, raw=True) is first  # the memo's own list


def test_a_block_that_indexes_is_never_memoised() -> None:
    server = Encoder()
    headers = [(b":status", b"200"), (b"x-trace", b"abc")]
    first_block = server.encode(headers)  # adds x-trace to both tables
    second_block = server.encode(headers)  # refers to the table entry
    decoder = MemoDecoder(65536)
    assert decoder.decode(first_block, raw=True) == headers
    assert decoder.decode(second_block, raw=True) == headers
    assert decoder._memo == {}


def test_the_memos_stay_bounded() -> None:
    encoder, decoder = StaticEncoder(), MemoDecoder(65536)
    for length in range(3 * MEMO_ENTRIES):
        headers = [(b"content-length", b"%d" % length)]
        assert decoder.decode(encoder.encode(headers), raw=True) == headers
    assert len(encoder._memo) <= MEMO_ENTRIES and len(decoder._memo) <= MEMO_ENTRIES
