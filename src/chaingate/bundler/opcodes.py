"""Which opcodes a contract's code could ever execute, from its bytes alone (sans-IO).

The EVM executes code from offset 0, one instruction after another, skipping PUSH data, and a
JUMP/JUMPI may only land on a JUMPDEST at an instruction boundary of that same linear sweep
(the node's jump-destination analysis is exactly this sweep).  So every executed instruction
is a boundary of the sweep, and it is *live*: offset 0, or right after an instruction that
can fall through, or a JUMPDEST.  Instructions after one that never falls through (STOP,
RETURN, REVERT, INVALID, JUMP, SELFDESTRUCT) are dead until the next JUMPDEST boundary.

``profile(code)`` gives the set of live opcodes — a superset of what any execution of the
code can run — and whether a live GAS is ever not immediately followed by a *CALL (OP-012:
after GAS the next executed instruction is the very next byte, so the adjacency is exact).

solc's CBOR metadata trailer (its length in the last two bytes) after the final INVALID is
dead by the same rule and needs no special case; stripping it blindly would not be sound (a
contract could jump to a JUMPDEST hidden in a "trailer").  If a trailer byte 0x5b happens to
sit at a boundary, what follows it counts: stricter, never laxer.

The ``opcodes`` are those of the Cancun table; an unassigned byte is kept as what it is (an
opcode the caller should treat as unknown), never as terminal: a newer fork may define it.

``reachable(code, selector)`` refines this for one call: an abstract execution over every
path, knowing the selector, PUSH constants and words a JUMPI already tested, prunes the other
functions of a contract (SimpleAccount's EXTCODESIZE lives in ``execute``/upgrade code, not in
``validateUserOp``).  It gives up (None) rather than guess: then ``profile`` is used.
``ProfileCache`` keeps both, bounded, by code hash and selector.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from chaingate.evm.keccak import keccak256

__all__ = ["CALLS", "CODES", "CodeCache", "CodeProfile", "ProfileCache", "profile", "reachable"]

STOP, JUMP, JUMPDEST, GAS, PUSH1, PUSH32 = 0x00, 0x56, 0x5B, 0x5A, 0x60, 0x7F
RETURN, REVERT, INVALID, SELFDESTRUCT = 0xF3, 0xFD, 0xFE, 0xFF
CALLS = frozenset({0xF1, 0xF2, 0xF4, 0xFA})  # CALL, CALLCODE, DELEGATECALL, STATICCALL
# Never fall through to the next byte.  (An unassigned opcode halts on Cancun, but is not
# counted here: a node on a newer fork might run it and go on.)
_TERMINAL = frozenset({STOP, JUMP, RETURN, REVERT, INVALID, SELFDESTRUCT})


class CodeProfile(msgspec.Struct, frozen=True):
    """What any execution of one contract's code can run."""

    opcodes: frozenset[int]  # the live opcodes of the linear sweep
    lone_gas: bool  # some live GAS is not immediately followed by a *CALL


def profile(code: bytes) -> CodeProfile:
    """The live opcodes of ``code`` by a linear sweep (PUSH data skipped)."""
    found: set[int] = set()
    lone_gas = False
    live = True
    i, end = 0, len(code)
    while i < end:
        op = code[i]
        if op == JUMPDEST:
            live = True
        if live:
            found.add(op)
            if op == GAS and (i + 1 >= end or code[i + 1] not in CALLS):
                lone_gas = True
            if op in _TERMINAL:
                live = False
        i += op - PUSH1 + 2 if PUSH1 <= op <= PUSH32 else 1
    return CodeProfile(opcodes=frozenset(found), lone_gas=lone_gas)


# (pops, pushes) of every Cancun opcode; a byte not here is unassigned.
EFFECTS: dict[int, tuple[int, int]] = {
    0x00: (0, 0), **dict.fromkeys(range(0x01, 0x08), (2, 1)), 0x08: (3, 1), 0x09: (3, 1),
    0x0A: (2, 1), 0x0B: (2, 1), **dict.fromkeys(range(0x10, 0x15), (2, 1)), 0x15: (1, 1),
    0x16: (2, 1), 0x17: (2, 1), 0x18: (2, 1), 0x19: (1, 1),
    **dict.fromkeys(range(0x1A, 0x1E), (2, 1)), 0x20: (2, 1),
    0x30: (0, 1), 0x31: (1, 1), 0x32: (0, 1), 0x33: (0, 1), 0x34: (0, 1), 0x35: (1, 1),
    0x36: (0, 1), 0x37: (3, 0), 0x38: (0, 1), 0x39: (3, 0), 0x3A: (0, 1), 0x3B: (1, 1),
    0x3C: (4, 0), 0x3D: (0, 1), 0x3E: (3, 0), 0x3F: (1, 1), 0x40: (1, 1),
    **dict.fromkeys(range(0x41, 0x49), (0, 1)), 0x49: (1, 1), 0x4A: (0, 1),
    0x50: (1, 0), 0x51: (1, 1), 0x52: (2, 0), 0x53: (2, 0), 0x54: (1, 1), 0x55: (2, 0),
    0x56: (1, 0), 0x57: (2, 0), 0x58: (0, 1), 0x59: (0, 1), 0x5A: (0, 1), 0x5B: (0, 0),
    0x5C: (1, 1), 0x5D: (2, 0), 0x5E: (3, 0), 0x5F: (0, 1),
    **dict.fromkeys(range(PUSH1, PUSH32 + 1), (0, 1)),
    **{0x80 + n: (n + 1, n + 2) for n in range(16)},  # DUP1..DUP16
    **{0x90 + n: (n + 2, n + 2) for n in range(16)},  # SWAP1..SWAP16
    **{0xA0 + n: (n + 2, 0) for n in range(5)},  # LOG0..LOG4
    0xF0: (3, 1), 0xF1: (7, 1), 0xF2: (7, 1), 0xF3: (2, 0), 0xF4: (6, 1), 0xF5: (4, 1),
    0xFA: (6, 1), 0xFD: (2, 0), 0xFE: (0, 0), 0xFF: (1, 0),
}  # fmt: skip

JUMPI, PC, CALLDATALOAD = 0x57, 0x58, 0x35
_WORD = (1 << 256) - 1
# Abstract stack values.  An int is a known word.  A tuple is an unknown word with an
# identity, so a test of it on one branch is known on the paths that follow:
# ("v", n) a word; ("z", n) ISZERO of word n; ("nz", n) ISZERO of ("z", n);
# ("cd", 0) the word CALLDATALOAD(0): the selector in its top 4 bytes, the rest unknown.
Sym = tuple[str, int]
Value = int | Sym
_CD0: Sym = ("cd", 0)
# Steps of abstract execution before giving up (at worst ~60 ms, then cached): code needing
# more is not refined (the linear sweep is used).  The EntryPoint's simulateValidation needs
# ~15,000; SimpleAccount's and VerifyingPaymaster's validation functions ~1,500-3,500.
MAX_STEPS = 40_000


def _canonical(stack: list[Value]) -> tuple[Value, ...]:
    """The stack with unknowns renumbered by first appearance: states that differ only in
    the numbering are one state (so a loop making new unknowns comes back to a seen state)."""
    names: dict[int, int] = {}
    out: list[Value] = []
    for value in stack:
        if isinstance(value, tuple) and value[0] != "cd":
            value = (value[0], names.setdefault(value[1], len(names)))
        out.append(value)
    return tuple(out)


def _known(stack: list[Value], word: int, zero: bool) -> list[Value]:
    """``stack`` on a path where unknown word ``word`` is known to be zero (or non-zero)."""
    if zero:
        sub: dict[Value, Value] = {("v", word): 0, ("z", word): 1, ("nz", word): 0}
    else:
        sub = {("z", word): 0, ("nz", word): 1}
    return [sub.get(v, v) if isinstance(v, tuple) else v for v in stack]


def _compute(op: int, args: list[Value], pc: int, selector: int, fresh: Sym) -> Value:
    """The word ``op`` pushes: folded when the abstraction knows it (bitwise ops and
    comparisons only: they cannot count up in a loop; ADD/SUB/... of known words give an
    unknown), else ``fresh``."""
    if op == PC:
        return pc
    if op == 0x5F:  # PUSH0
        return 0
    if op == CALLDATALOAD:
        return _CD0 if args[0] == 0 else fresh
    if not args:
        return fresh
    first = args[0]
    if op == 0x15 and isinstance(first, tuple) and first[0] != "cd":  # ISZERO
        return {"v": ("z", first[1]), "z": ("nz", first[1]), "nz": ("z", first[1])}[first[0]]
    if op == 0x1C and args[1] == _CD0 and isinstance(first, int):  # SHR of CALLDATALOAD(0)
        return fresh if first < 224 else (selector >> (first - 224) if first < 256 else 0)
    if op == 0x04 and first == _CD0 and isinstance(args[1], int):  # DIV by 2**k (old solc)
        k = args[1].bit_length() - 1
        return selector >> (k - 224) if k >= 224 and args[1] == 1 << k else fresh
    if not all(isinstance(x, int) for x in args):
        return fresh
    a = first
    b = args[1] if len(args) > 1 else 0
    assert isinstance(a, int)
    assert isinstance(b, int)
    if op == 0x14:
        return int(a == b)
    if op == 0x15:
        return int(a == 0)
    if op == 0x10:
        return int(a < b)
    if op == 0x11:
        return int(a > b)
    if op == 0x16:
        return a & b
    if op == 0x17:
        return a | b
    if op == 0x1B:  # SHL: shift, value
        return (b << a) & _WORD if a < 256 else 0
    if op == 0x1C:
        return b >> a if a < 256 else 0
    if op == 0x04:
        return a // b if b else 0
    return fresh


def reachable(code: bytes, selector: int) -> CodeProfile | None:
    """``reachable_within`` without the extent."""
    return reachable_within(code, selector)[0]


def reachable_within(code: bytes, selector: int) -> tuple[CodeProfile | None, int | None]:
    """(profile, extent): the opcodes any execution of ``code`` *called with this 4-byte
    selector* can run, by abstract execution from offset 0 over every path. Known words: PUSH
    data, PC, the selector (CALLDATALOAD(0) shifted or divided down), bitwise/comparison results
    of known words, and an unknown word on a path after a JUMPI that tested it (or its ISZERO)
    for zero (solc's ``DUP1 ISZERO PUSH tag JUMPI`` after a call, tested again at the join). A
    JUMPI on a known condition takes one way, on an unknown one both; a jump to an unknown
    target, an unassigned opcode or ``MAX_STEPS`` gives up (None). Every real execution follows
    one of the explored paths (stack heights are exact, a known word equals the real one), so
    the result is a superset of what runs, never laxer than ``profile`` and much smaller for a
    contract whose other functions do what a rule bans.

    ``extent``: the analysis read no byte at or past it (executed opcodes, PUSH data, jump
    targets, the byte after a GAS) and never ran off the code's end, so any code starting with
    ``code[:extent]`` has this same profile (a JUMPDEST below it is one in both: the sweep
    that finds them reads only the bytes before); None when the profile depends on more (the
    code's end, or a give-up).  A constructor's init code ends with its arguments, which its
    code only copies: its profile holds for every argument (``ProfileCache``).
    """
    end = len(code)
    extent = 0
    jumpdests: set[int] = set()
    i = 0
    while i < end:
        op = code[i]
        if op == JUMPDEST:
            jumpdests.add(i)
        i += op - PUSH1 + 2 if PUSH1 <= op <= PUSH32 else 1
    found: set[int] = set()
    lone_gas = False
    seen: set[tuple[int, tuple[Value, ...]]] = set()
    work: list[tuple[int, tuple[Value, ...]]] = [(0, ())]
    steps = 0
    while work:
        entry = work.pop()
        if entry in seen:
            continue
        seen.add(entry)
        pc, frozen = entry
        steps += len(frozen) >> 2  # copying, renumbering and hashing a state cost its depth
        stack = list(frozen)
        counter = len(stack)  # fresh unknowns: above any number in the canonical stack
        while pc < end:  # past the end: STOP
            steps += 1
            if steps > MAX_STEPS:
                return None, None
            op = code[pc]
            extent = max(extent, pc + 1)
            found.add(op)
            effect = EFFECTS.get(op)
            if effect is None:
                return None, None  # unassigned: a newer fork may give it a meaning
            pops, pushes = effect
            if len(stack) < pops or len(stack) - pops + pushes > 1024:
                break  # stack underflow/overflow: the EVM halts here
            if op == GAS:
                extent = max(extent, pc + 2)
                if pc + 1 >= end or code[pc + 1] not in CALLS:
                    lone_gas = True
            if PUSH1 <= op <= PUSH32:
                n = op - PUSH1 + 1
                extent = max(extent, pc + 1 + n)
                stack.append(int.from_bytes(code[pc + 1 : pc + 1 + n].ljust(n, b"\0"), "big"))
                pc += n + 1
                continue
            if 0x80 <= op <= 0x8F:
                stack.append(stack[-(op - 0x7F)])
            elif 0x90 <= op <= 0x9F:
                k = op - 0x8E
                stack[-1], stack[-k] = stack[-k], stack[-1]
            elif op in (JUMP, JUMPI):
                target = stack.pop()
                cond: Value = stack.pop() if op == JUMPI else 1
                taken, fallen = _branches(stack, cond)
                if taken is not None:
                    if not isinstance(target, int):
                        return None, None
                    extent = max(extent, min(target, end) + 1)
                    if target in jumpdests:
                        work.append((target, _canonical(taken)))
                if op == JUMPI and fallen is not None:
                    work.append((pc + 1, _canonical(fallen)))
                break
            elif op in _TERMINAL:
                break
            else:
                args = [stack.pop() for _ in range(pops)]
                if pushes:
                    counter += 1
                    stack.append(_compute(op, args, pc, selector, ("v", counter)))
            pc += 1
        else:
            extent = end + 1  # ran off the end: the profile depends on where it is
    profile = CodeProfile(opcodes=frozenset(found), lone_gas=lone_gas)
    return profile, (extent if extent <= end else None)


def _branches(stack: list[Value], cond: Value) -> tuple[list[Value] | None, list[Value] | None]:
    """The stack on the taken and on the fall-through path of a JUMPI on ``cond`` (None: that
    path cannot happen)."""
    if isinstance(cond, int):
        return (stack, None) if cond != 0 else (None, stack)
    kind, word = cond
    if kind in ("v", "nz"):  # taken iff word != 0
        return _known(stack, word, zero=False), _known(stack, word, zero=True)
    if kind == "z":  # taken iff word == 0
        return _known(stack, word, zero=True), _known(stack, word, zero=False)
    return stack, stack  # CALLDATALOAD(0)


class ProfileCache:
    """Profiles by code hash (``profile``) and by code hash and selector (``reachable``, or
    ``profile`` where it gives up); least recently used first out, at most ``size`` each.  A
    ``reachable`` profile with an extent is also kept under the hash of the code up to it:
    another code with that prefix (a constructor's with other arguments) gets it without
    another analysis; at most ``MAX_PREFIX_LENGTHS`` distinct prefix lengths are tried."""

    MAX_PREFIX_LENGTHS = 16

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise ValueError("cache size must be at least 1")
        self.size = size
        self._items: OrderedDict[tuple[bytes, int | None], CodeProfile] = OrderedDict()
        self._prefixed: OrderedDict[tuple[int, bytes, int], CodeProfile] = OrderedDict()
        self._lengths: OrderedDict[int, None] = OrderedDict()

    def get(self, code_hash: bytes, code: bytes, selector: int | None = None) -> CodeProfile:
        key = (code_hash, selector)
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            return found
        made = None
        if selector is not None:
            made = self._by_prefix(code, selector)
            if made is None:
                made, extent = reachable_within(code, selector)
                if made is not None and extent is not None:
                    self._keep_prefix(code, selector, extent, made)
        if made is None:
            made = profile(code)
        self._items[key] = made
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return made

    def _by_prefix(self, code: bytes, selector: int) -> CodeProfile | None:
        for length in self._lengths:
            if length <= len(code):
                found = self._prefixed.get((length, keccak256(code[:length]), selector))
                if found is not None:
                    return found
        return None

    def _keep_prefix(self, code: bytes, selector: int, extent: int, made: CodeProfile) -> None:
        self._prefixed[(extent, keccak256(code[:extent]), selector)] = made
        if len(self._prefixed) > self.size:
            self._prefixed.popitem(last=False)
        self._lengths[extent] = None
        self._lengths.move_to_end(extent)
        if len(self._lengths) > self.MAX_PREFIX_LENGTHS:
            self._lengths.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class CodeCache:
    """Codes as a node sends them (0x-hex) -> (the bytes, their keccak), least recently used
    out first, the keys holding at most ``max_chars`` together.  Every validation's prestate
    holds the same few codes (the EntryPoint's simulations, its SenderCreator, the factory, the
    account's implementation, the paymaster): decoding and hashing them each time was ~0.4 ms
    of a deploying operation's CPU.  Keyed by the text itself, so a hit is exact."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._items: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()
        self._chars = 0
        # (length, last 64 characters) -> the key last seen with them.  A node's answer is a
        # new string each time, and hashing it whole for the lookup cost ~1.5 instructions a
        # character (callgrind: ~60,000 per operation, a SimpleAccount's implementation is
        # ~20,000 characters); comparing it with the one candidate this finds is a memcmp.
        self._seen: dict[tuple[int, str], str] = {}

    def get(self, text: str) -> tuple[bytes, bytes]:
        """ValueError for text that is not 0x-hex."""
        candidate = self._seen.get((len(text), text[-64:]))
        if candidate is not None and candidate == text:
            text = candidate  # the key's own string: its hash is cached
        found = self._items.get(text)
        if found is not None:
            self._items.move_to_end(text)
            return found
        if text[:2] not in ("0x", "0X"):
            raise ValueError("not 0x-hex")
        code = bytes.fromhex(text[2:])
        made = (code, keccak256(code))
        self._items[text] = made
        self._seen[(len(text), text[-64:])] = text
        self._chars += len(text)
        while self._chars > self.max_chars and len(self._items) > 1:
            gone, _ = self._items.popitem(last=False)
            self._chars -= len(gone)
            if self._seen.get((len(gone), gone[-64:])) is gone:
                del self._seen[(len(gone), gone[-64:])]
        return made


# The nodes' codes (prestates, eth_getCode) decoded and hashed: the same few every time.
CODES = CodeCache(8_000_000)
