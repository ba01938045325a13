"""The follower's memory of the canonical chain's tail: pure data, no I/O.

``Window`` holds the last ``keep`` canonical blocks, each linked to the previous one by its
parent hash.  ``find_fork`` decides, for a new head, where it joins what we hold; the follower
feeds it headers it fetched (sans-IO in the h11 sense: the decision logic never waits).
"""

from __future__ import annotations

from collections.abc import Iterator

from chaingate.chain.events import Block, BlockHeader


class BrokenLink(Exception):
    """A block does not extend the window's tip (its parent hash differs)."""


class Window:
    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.keep = keep
        self._blocks: dict[int, Block] = {}
        self._tip: Block | None = None

    def __iter__(self) -> Iterator[Block]:
        """Oldest first."""
        return (self._blocks[n] for n in sorted(self._blocks))

    @property
    def tip(self) -> Block | None:
        return self._tip

    @property
    def base(self) -> int | None:
        """Number of the oldest block held."""
        return min(self._blocks) if self._blocks else None

    def get(self, number: int) -> Block | None:
        return self._blocks.get(number)

    def holds(self, header: BlockHeader) -> bool:
        block = self._blocks.get(header.number)
        return block is not None and block.header.hash == header.hash

    def push(self, block: Block) -> Block | None:
        """Append the next canonical block; return the block that fell off the tail, if any."""
        tip = self._tip
        if tip is not None and (
            block.header.number != tip.header.number + 1
            or block.header.parent_hash != tip.header.hash
        ):
            raise BrokenLink(
                f"block {block.header.number} {block.header.hash} does not extend "
                f"{tip.header.number} {tip.header.hash}"
            )
        self._blocks[block.header.number] = block
        self._tip = block
        oldest = block.header.number - self.keep
        return self._blocks.pop(oldest, None)

    def pop(self) -> Block:
        """Remove and return the tip (a reorg reverts it)."""
        tip = self._tip
        if tip is None:
            raise IndexError("pop from an empty window")
        del self._blocks[tip.header.number]
        self._tip = self._blocks.get(tip.header.number - 1)
        return tip

    def clear(self) -> list[Block]:
        """Empty the window; return its blocks newest first."""
        blocks = [self._blocks[n] for n in sorted(self._blocks, reverse=True)]
        self._blocks.clear()
        self._tip = None
        return blocks


class Fork:
    """Where a new head joins the window: the common ancestor and the new branch above it."""

    __slots__ = ("ancestor", "branch", "missing")

    def __init__(self) -> None:
        self.ancestor: int | None = None  # number of the common ancestor, once found
        self.branch: list[BlockHeader] = []  # new blocks above the ancestor, newest first
        self.missing: str | None = None  # hash of a header to fetch before going on


class DeepReorg(Exception):
    """The new chain leaves the window below its oldest block: deeper than finality."""


def find_fork(window: Window, head: BlockHeader, known: dict[str, BlockHeader]) -> Fork:
    """Walk from ``head`` down its parents until a block the window holds.

    ``known`` maps hashes to headers already fetched.  The result either names the ancestor
    (``ancestor`` set; ``branch`` newest first — empty when the head is already held) or asks
    for one more header (``missing``): fetch it, add it to ``known``, call again.
    """
    fork = Fork()
    current = head
    base = window.base
    while True:
        if window.holds(current):
            fork.ancestor = current.number
            return fork
        fork.branch.append(current)
        parent = window.get(current.number - 1)
        if parent is not None and parent.header.hash == current.parent_hash:
            fork.ancestor = parent.header.number
            return fork
        if base is None or current.number - 1 < base:
            raise DeepReorg(
                f"block {current.number} joins no block held (held from {base}); "
                "the reorg is deeper than the window"
            )
        found = known.get(current.parent_hash)
        if found is None:
            fork.missing = current.parent_hash
            fork.branch.clear()
            return fork
        current = found
