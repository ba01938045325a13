"""The JavaScript collector run by ``debug_traceCall`` over a validation simulation.

It only collects; ``rules.py`` judges.  The EntryPoint runs at depth 1 and each call it makes
from there (the SenderCreator for the factory, the account's ``validateUserOp``, the
paymaster's ``validatePaymasterUserOp``) opens a *phase*: everything that call does, at any
depth, is recorded in that phase — opcodes by contract, storage slots read and written by
contract, code size of every address touched by EXTCODE* or *CALL, the calls made (with value
and method), contracts created, out-of-gas.  KECCAK256 preimages whose first word looks like
an address are kept globally: ``keccak(A || x)`` is how associated storage is recognised.

Three anvil (revm-inspectors) facts shape it, checked on anvil 1.7.1 and recorded in
H4-decisions: ``log.getCost()`` reports the *previous* step's cost, so out-of-gas is read
from the error of the frame that ran out (``exit``/``fault``), never ``getGas() < getCost()``;
``enter``/``exit`` give each frame's type, target, value and (for CREATE2) the new address;
and a ``step`` hook costs ~13 us per opcode before it does anything, so ``step`` looks the
opcode number up in a table (``KINDS``) and returns at once for the ~90% that matter to no
rule — names, addresses and hex are only built for the few that do.

Every list and map is capped (``MAX_*``); a capped trace sets ``overflow`` and is refused as
too large to judge rather than judged on a part.
"""

from __future__ import annotations

# keccak256("BeforeExecution()"): v0.7 emits it between validation and execution.
BEFORE_EXECUTION_TOPIC = "bb47ee3e183a558b1a2ff0874b079f3fc5478b7454eacf2bfc5af2ff5878f972"

MAX_KECCAK = 4096  # preimages kept
MAX_KECCAK_LEN = 512  # bytes; longer preimages are not address-keyed mappings
MAX_SLOTS = 8192  # storage slots recorded over the whole trace
MAX_CALLS = 2048  # frames recorded over the whole trace
MAX_PHASES = 16  # top-level calls from the EntryPoint (a validation makes at most ~6)

# What step() does with each opcode number.
IGNORE, CALLISH, LOG1, NAMED, LOAD, STORE, KECCAK, EXTCODE, GAS = range(9)

# Assigned opcodes (Cancun); any other number is unassigned (OP-013) and recorded by name.
_ASSIGNED = (
    set(range(0x00, 0x0C))
    | set(range(0x10, 0x1E))
    | {0x20}
    | set(range(0x30, 0x4B))
    | set(range(0x50, 0xA5))
    | set(range(0xF0, 0xF6))
    | {0xFA, 0xFD, 0xFE, 0xFF}
)
# Recorded by name: the environment opcodes (OP-011), BALANCE/SELFBALANCE (OP-080), CREATE*
# (OP-031/032), INVALID and SELFDESTRUCT.
_NAMED = {
    0x31, 0x32, 0x3A, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x47, 0x48, 0x49, 0x4A,
    0xF0, 0xF5, 0xFE, 0xFF,
}  # fmt: skip


def _kind(number: int) -> int:
    if number not in _ASSIGNED or number in _NAMED:
        return NAMED
    return {
        0xF1: CALLISH,
        0xF2: CALLISH,
        0xF4: CALLISH,
        0xFA: CALLISH,
        0xA1: LOG1,
        0x54: LOAD,
        0x5C: LOAD,
        0x55: STORE,
        0x5D: STORE,
        0x20: KECCAK,
        0x3B: EXTCODE,
        0x3C: EXTCODE,
        0x3F: EXTCODE,
        0x5A: GAS,
    }.get(number, IGNORE)


KINDS = [_kind(n) for n in range(256)]

_JS = r"""{
  kinds: @KINDS@,
  phases: [],
  cur: null,
  entryPoint: null,
  keccak: [],
  slots: 0,
  calls: 0,
  overflow: false,
  // On anvil a tracer that throws does not fail the trace: the frame being traced reverts
  // and execution goes on, changed.  So nothing may throw: a hook that fails records why,
  // and the trace is refused as unjudgeable instead.
  failed: null,
  stopped: false,
  gasAt: null,
  extPending: null,
  // Per open frame (enter..exit), whether it is a precompile: one running out of gas is a
  // precompile refusing its input, not the validation's code (OP-062 allows precompiles).
  precompiles: [],

  count: function (map, key, sub) {
    var m = map[key];
    if (m === undefined) { m = {}; map[key] = m; }
    m[sub] = (m[sub] || 0) + 1;
  },

  slot: function (addr, written, key) {
    var a = this.cur.storage[addr];
    if (a === undefined) { a = {r: {}, w: {}}; this.cur.storage[addr] = a; }
    var m = written ? a.w : a.r;
    if (m[key] === undefined) {
      if (this.slots >= @MAX_SLOTS@) { this.overflow = true; return; }
      this.slots++;
      m[key] = 0;
    }
    m[key]++;
  },

  touch: function (addr, op, db) {
    if (this.cur.code[addr] === undefined) {
      var a = toAddress(addr);
      this.cur.code[addr] = {size: isPrecompiled(a) ? -1 : db.getCode(a).length, op: op};
    }
  },

  // The step after GAS or after EXTCODE* of the EntryPoint decides whether those count.
  settle: function (n) {
    if (this.gasAt !== null) {
      // GAS is fine right before a *CALL (OP-012): Solidity passes gasleft() that way.
      if (this.kinds[n] !== @CALLISH@) { this.count(this.cur.opcodes, 'GAS', this.gasAt); }
      this.gasAt = null;
    }
    if (this.extPending !== null) {
      // EXTCODESIZE of the EntryPoint followed by ISZERO is the "has code" check (OP-051).
      if (!(this.extPending.op === 'EXTCODESIZE' && n === 0x15)) {
        this.count(this.cur.ext, this.extPending.op, this.extPending.at);
      }
      this.extPending = null;
    }
  },

  step: function (log, db) {
    try { this.stepInner(log, db); } catch (e) { this.fail(e); }
  },

  fail: function (e) {
    if (this.failed === null) { this.failed = String(e).slice(0, 200); }
    this.stopped = true;
  },

  stepInner: function (log, db) {
    if (this.stopped) { return; }
    var n = log.op.toNumber();
    if (this.gasAt !== null || this.extPending !== null) { this.settle(n); }
    var kind = this.kinds[n];
    if (kind === @IGNORE@) { return; }
    if (log.getDepth() === 1) {
      if (this.entryPoint === null) { this.entryPoint = toHex(log.contract.getAddress()); }
      if (kind === @CALLISH@ && (n === 0xf1 || n === 0xfa)) {
        if (this.phases.length >= @MAX_PHASES@) {
          this.overflow = true;
          this.stopped = true;
          return;
        }
        var at = parseInt(log.stack.peek(n === 0xf1 ? 3 : 2).toString());
        var len = parseInt(log.stack.peek(n === 0xf1 ? 4 : 3).toString());
        this.cur = {
          target: toHex(toAddress(log.stack.peek(1).toString(16))),
          method: len >= 4 ? toHex(log.memory.slice(at, at + 4)) : '0x',
          opcodes: {}, storage: {}, code: {}, calls: [], ext: {}, oog: false
        };
        this.phases.push(this.cur);
      } else if (kind === @LOG1@ && log.stack.peek(2).toString(16) === '@TOPIC@') {
        this.stopped = true;
      }
      return;
    }
    if (this.cur === null) { return; }
    var here = toHex(log.contract.getAddress());
    if (kind === @NAMED@) {
      this.count(this.cur.opcodes, log.op.toString(), here);
    } else if (kind === @GAS@) {
      this.gasAt = here;
    } else if (kind === @LOAD@ || kind === @STORE@) {
      this.slot(here, kind === @STORE@, toHex(toWord(log.stack.peek(0).toString(16))));
    } else if (kind === @KECCAK@) {
      var ofs = parseInt(log.stack.peek(0).toString());
      var size = parseInt(log.stack.peek(1).toString());
      if (size >= 32 && size <= @MAX_KECCAK_LEN@) {
        // KECCAK256 may read past the memory used so far (it reads zeros there).
        var used = log.memory.length();
        var pre = ofs + size <= used ? toHex(log.memory.slice(ofs, ofs + size))
          : '0x' + (ofs < used ? toHex(log.memory.slice(ofs, used)).slice(2) : '')
            + '00'.repeat(ofs + size - Math.max(ofs, used));
        // only a word with 12 zero bytes in front can hold an address
        if (pre.slice(2, 26) === '000000000000000000000000') {
          if (this.keccak.length >= @MAX_KECCAK@) { this.overflow = true; }
          else { this.keccak.push(pre); }
        }
      }
    } else if (kind === @EXTCODE@) {
      var ext = toHex(toAddress(log.stack.peek(0).toString(16)));
      var name = log.op.toString();
      this.touch(ext, name, db);
      if (ext === this.entryPoint) { this.extPending = {op: name, at: here}; }
    } else if (kind === @CALLISH@) {
      this.touch(toHex(toAddress(log.stack.peek(1).toString(16))), log.op.toString(), db);
    }
  },

  enter: function (frame) {
    try { this.enterInner(frame); } catch (e) { this.fail(e); }
  },

  enterInner: function (frame) {
    if (this.stopped || this.cur === null) { return; }
    this.precompiles.push(isPrecompiled(frame.getTo()));
    if (this.calls >= @MAX_CALLS@) { this.overflow = true; return; }
    this.calls++;
    var value = frame.getValue();
    this.cur.calls.push({
      type: frame.getType(),
      from: toHex(frame.getFrom()),
      to: toHex(frame.getTo()),
      method: toHex(frame.getInput().slice(0, 4)),
      value: value === undefined ? '0x0' : '0x' + value.toString(16)
    });
  },

  exit: function (result) {
    if (this.stopped || this.cur === null) { return; }
    var precompile = this.precompiles.pop();
    var error = result.getError();
    if (!precompile && error !== undefined && /out ?of ?gas/i.test(String(error))) {
      this.cur.oog = true;
    }
  },

  fault: function (log, db) {
    if (this.cur !== null && log.getDepth() > 1 && /out ?of ?gas/i.test(String(log.getError()))) {
      this.cur.oog = true;
    }
  },

  result: function (ctx, db) {
    return {
      phases: this.phases,
      keccak: this.keccak,
      entryPoint: this.entryPoint,
      overflow: this.overflow,
      failed: this.failed,
      output: toHex(ctx.output),
      error: ctx.error === undefined ? null : String(ctx.error)
    };
  }
}"""

_VALUES = {
    "KINDS": "[" + ",".join(map(str, KINDS)) + "]",
    "TOPIC": BEFORE_EXECUTION_TOPIC,
    "MAX_KECCAK": str(MAX_KECCAK),
    "MAX_KECCAK_LEN": str(MAX_KECCAK_LEN),
    "MAX_SLOTS": str(MAX_SLOTS),
    "MAX_CALLS": str(MAX_CALLS),
    "MAX_PHASES": str(MAX_PHASES),
    **{
        name: str(value)
        for name, value in zip(
            ("IGNORE", "CALLISH", "LOG1", "NAMED", "LOAD", "STORE", "KECCAK", "EXTCODE", "GAS"),
            range(9),
            strict=True,
        )
    },
}


def _render(template: str) -> str:
    for name, value in _VALUES.items():
        template = template.replace(f"@{name}@", value)
    if "@" in template:
        raise RuntimeError("tracer template has an unfilled @placeholder@")
    return template


COLLECTOR_JS = _render(_JS)
