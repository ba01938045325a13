// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

// Test entities for the ERC-7562 rules (tests/test_bundler_rules.py): an account, a paymaster
// and a factory for EntryPoint v0.6 and v0.7 alike, each obeying the rules in mode 0 and
// breaking exactly one rule in every other mode. The mode comes from the operation itself
// (signature / paymasterData / factoryData), never from storage, so reading it breaks nothing.

struct UserOperation06 {
    address sender;
    uint256 nonce;
    bytes initCode;
    bytes callData;
    uint256 callGasLimit;
    uint256 verificationGasLimit;
    uint256 preVerificationGas;
    uint256 maxFeePerGas;
    uint256 maxPriorityFeePerGas;
    bytes paymasterAndData;
    bytes signature;
}

struct PackedUserOperation07 {
    address sender;
    uint256 nonce;
    bytes initCode;
    bytes callData;
    bytes32 accountGasLimits;
    uint256 preVerificationGas;
    bytes32 gasFees;
    bytes paymasterAndData;
    bytes signature;
}

interface IEntryPointLike {
    function getNonce(address sender, uint192 key) external view returns (uint256);
    function addStake(uint32 unstakeDelaySec) external payable;
}

// A bystander contract: a mapping keyed by address (associated storage) and a free slot.
contract RuleStore {
    mapping(address => uint256) public balances;
    uint256 public shared;

    function bump(address who) external { balances[who] += 1; }
    function touchShared() external { shared += 1; }
    function readShared() external view returns (uint256) { return shared; }
    receive() external payable {}
}

library Breaks {
    uint256 constant OK = 0;
    uint256 constant TIMESTAMP = 1;
    uint256 constant NUMBER = 2;
    uint256 constant GAS = 3;
    uint256 constant BALANCE = 4;
    uint256 constant WRITE_OTHER = 5; // a non-associated slot of another contract
    uint256 constant WRITE_ASSOCIATED = 6; // balances[sender] of another contract: allowed
    uint256 constant OOG = 7; // an inner call runs out of gas, caught
    uint256 constant VALUE_CALL = 8;
    uint256 constant NO_CODE = 9; // EXTCODESIZE of an address without code
    uint256 constant ENTRY_POINT_CALL = 10; // getNonce on the EntryPoint
    uint256 constant CREATE = 11;
    uint256 constant READ_OTHER = 12; // read-only a non-associated slot: needs stake
    uint256 constant OWN_STORAGE = 13; // write own storage (paymaster/factory: needs stake)
    uint256 constant SELFBALANCE = 14;
    uint256 constant COINBASE = 15;
    uint256 constant BASEFEE = 16;
    uint256 constant ORIGIN = 17;
    uint256 constant GASPRICE = 18;
    uint256 constant BLOCKHASH = 19;
    uint256 constant PRECOMPILES = 20; // calls 0x1..0x9 with 1,000 gas: some run out (OP-062)
    uint256 constant FAILING = 21; // RuleAccount: reverts once setFailing(true) was called
    uint256 constant CONTEXT = 22; // RulePaymaster: returns a context (EREP-050)

    function run(uint256 mode, RuleStore store, address sender) internal returns (uint256 sink) {
        if (mode == TIMESTAMP) {
            sink = block.timestamp;
        } else if (mode == NUMBER) {
            sink = block.number;
        } else if (mode == GAS) {
            sink = gasleft();
        } else if (mode == BALANCE) {
            sink = address(store).balance;
        } else if (mode == WRITE_OTHER) {
            store.touchShared();
        } else if (mode == WRITE_ASSOCIATED) {
            store.bump(sender);
        } else if (mode == OOG) {
            try Burner(address(this)).burn{gas: 5000}() {} catch {}
        } else if (mode == VALUE_CALL) {
            (bool ok,) = payable(address(store)).call{value: 1}("");
            sink = ok ? 1 : 0;
        } else if (mode == NO_CODE) {
            sink = address(uint160(uint256(keccak256("nobody home")))).code.length;
        } else if (mode == CREATE) {
            sink = uint160(address(new RuleStore()));
        } else if (mode == READ_OTHER) {
            sink = store.readShared();
        } else if (mode == SELFBALANCE) {
            sink = address(this).balance;
        } else if (mode == COINBASE) {
            sink = uint160(address(block.coinbase));
        } else if (mode == BASEFEE) {
            sink = block.basefee;
        } else if (mode == ORIGIN) {
            sink = uint160(tx.origin);
        } else if (mode == GASPRICE) {
            sink = tx.gasprice;
        } else if (mode == BLOCKHASH) {
            sink = uint256(blockhash(1));
        } else if (mode == PRECOMPILES) {
            for (uint160 i = 1; i < 10; i++) {
                (bool ok,) = address(i).call{gas: 1000}("");
                sink += ok ? 1 : 0;
            }
        }
    }
}

// The account's prefund to the EntryPoint (its caller), as SimpleAccount pays it.
library Prefund {
    function pay(uint256 missing) internal {
        if (missing > 0) {
            (bool ok,) = payable(msg.sender).call{value: missing}("");
            ok;
        }
    }
}

interface Burner {
    function burn() external;
}

contract RuleAccount {
    uint256 public validations; // own storage: always allowed (STO-010)
    bool public failing; // mode FAILING: validation reverts once set (a second validation fails)
    RuleStore public immutable store;

    constructor(RuleStore store_) {
        store = store_;
    }

    function burn() external pure {
        uint256 i;
        while (true) { i++; }
    }

    function _validate(bytes calldata signature, uint256 missing) internal returns (uint256) {
        uint256 mode = signature.length >= 32 ? abi.decode(signature, (uint256)) : 0;
        if (mode == Breaks.OWN_STORAGE) {
            validations += 1;
        } else if (mode == Breaks.FAILING) {
            require(!failing, "failing");
        } else if (mode == Breaks.ENTRY_POINT_CALL) {
            IEntryPointLike(msg.sender).getNonce(address(this), 0);
        } else {
            Breaks.run(mode, store, address(this));
        }
        Prefund.pay(missing);
        return 0;
    }

    function validateUserOp(UserOperation06 calldata op, bytes32, uint256 missing)
        external returns (uint256) {
        return _validate(op.signature, missing);
    }

    function validateUserOp(PackedUserOperation07 calldata op, bytes32, uint256 missing)
        external returns (uint256) {
        return _validate(op.signature, missing);
    }

    function setFailing(bool value) external { failing = value; }

    function execute() external {}

    receive() external payable {}
}

contract RulePaymaster {
    uint256 public sponsored; // own storage: touching it needs stake (STO-031)
    RuleStore public immutable store;

    constructor(RuleStore store_) {
        store = store_;
    }

    function burn() external pure {
        uint256 i;
        while (true) { i++; }
    }

    function stake(IEntryPointLike entryPoint, uint32 delay) external payable {
        entryPoint.addStake{value: msg.value}(delay);
    }

    function _validate(bytes calldata data, address sender) internal returns (bytes memory, uint256) {
        uint256 mode = data.length > 0 ? uint8(data[0]) : 0;
        if (mode == Breaks.OWN_STORAGE) {
            sponsored += 1;
        } else if (mode == Breaks.CONTEXT) {
            return ("a context", 0);
        } else {
            Breaks.run(mode, store, sender);
        }
        return ("", 0);
    }

    function postOp(uint8, bytes calldata, uint256) external {}

    function postOp(uint8, bytes calldata, uint256, uint256) external {}

    function validatePaymasterUserOp(UserOperation06 calldata op, bytes32, uint256)
        external returns (bytes memory, uint256) {
        return _validate(op.paymasterAndData[20:], op.sender);
    }

    function validatePaymasterUserOp(PackedUserOperation07 calldata op, bytes32, uint256)
        external returns (bytes memory, uint256) {
        return _validate(op.paymasterAndData[52:], op.sender);
    }

    receive() external payable {}
}

contract RuleFactory {
    uint256 public deployed; // own storage: touching it needs stake (STO-031)
    RuleStore public immutable store;

    constructor(RuleStore store_) {
        store = store_;
    }

    function stake(IEntryPointLike entryPoint, uint32 delay) external payable {
        entryPoint.addStake{value: msg.value}(delay);
    }

    function accountAddress(bytes32 salt) public view returns (address) {
        bytes32 codeHash = keccak256(
            abi.encodePacked(type(RuleAccount).creationCode, abi.encode(store))
        );
        return address(uint160(uint256(keccak256(abi.encodePacked(bytes1(0xff), address(this), salt, codeHash)))));
    }

    // mode 0 obeys; 1 a second CREATE2 (OP-031); 2 writes own storage (STO-031); others as Breaks
    function deploy(bytes32 salt, uint256 mode) external returns (address account) {
        account = address(new RuleAccount{salt: salt}(store));
        if (mode == 1) {
            new RuleStore{salt: salt}();
        } else if (mode == 2) {
            deployed += 1;
        } else if (mode > 2) {
            Breaks.run(mode, store, account);
        }
    }
}

// EREP-020 as the compliance suite builds it: every account it creates passes validation on
// its own (the chain's count is 0 then), but in a bundle the second creation marks the new
// account failing, so that account's validation reverts (AA23) in the bundle.  The factory
// writes its own storage: it must be staked (STO-031).
contract RuleCountingFactory {
    uint256 public created;
    RuleStore public immutable store;

    constructor(RuleStore store_) {
        store = store_;
    }

    function stake(IEntryPointLike entryPoint, uint32 delay) external payable {
        entryPoint.addStake{value: msg.value}(delay);
    }

    function deploy(bytes32 salt) external returns (address account) {
        RuleAccount made = new RuleAccount{salt: salt}(store);
        if (created++ > 0) {
            made.setFailing(true);
        }
        account = address(made);
    }
}

// STO-041: an account that is also another account's "token".  With 20 bytes of callData its
// validation zeroes that address's balance here (its own storage); otherwise it requires a
// balance at ``other`` (storage associated with itself there).  Validated one at a time both
// pass; in one bundle after the first, the second fails.
contract RuleTokenAccount {
    mapping(address => uint256) public balances;
    RuleTokenAccount public other;

    function setBalance(address who, uint256 value) external { balances[who] = value; }

    function setOther(RuleTokenAccount value) external { other = value; }

    function _validate(bytes calldata callData, uint256 missing) internal returns (uint256) {
        if (callData.length == 20) {
            balances[address(bytes20(callData))] = 0;
        } else {
            require(other.balances(address(this)) > 0, "no balance");
        }
        Prefund.pay(missing);
        return 0;
    }

    function validateUserOp(UserOperation06 calldata op, bytes32, uint256 missing)
        external returns (uint256) {
        return _validate(op.callData, missing);
    }

    function validateUserOp(PackedUserOperation07 calldata op, bytes32, uint256 missing)
        external returns (uint256) {
        return _validate(op.callData, missing);
    }

    fallback() external payable {}
}

// The smallest account that obeys every rule (RuleAccount's deployment costs more gas than
// the fast path traces step by step).
contract RuleMiniAccount {
    function validateUserOp(UserOperation06 calldata, bytes32, uint256 missing)
        external returns (uint256) {
        Prefund.pay(missing);
        return 0;
    }

    function validateUserOp(PackedUserOperation07 calldata, bytes32, uint256 missing)
        external returns (uint256) {
        Prefund.pay(missing);
        return 0;
    }

    fallback() external payable {}
}

// A factory that, after deploying the account, reads the code size of ``target`` (EXTCODESIZE
// in the factory phase, the result compared): OP-054 when ``target`` is the EntryPoint,
// OP-041 when it has no code, allowed for a contract.
contract RuleReadingFactory {
    function deploy(bytes32 salt, address target) external returns (address account) {
        account = address(new RuleMiniAccount{salt: salt}());
        require(target.code.length != 12345, "odd");
    }
}

// An account whose validation can run no opcode a rule judges (static analysis sees SLOAD,
// CALL, STATICCALL: the fast path's lean build, without the prestate, is tried on it) but
// reads another contract's storage: with an empty signature the store's unassociated slot
// (``shared``: STO-033, an unstaked account may not), else its own entry of the store's
// mapping (associated with the sender: allowed).  The lean build must leave both to the
// prestate's slots.
contract RuleForeignReadAccount {
    RuleStore public immutable store;

    constructor(RuleStore value) { store = value; }

    function _validate(bytes calldata signature, uint256 missing) internal returns (uint256) {
        uint256 seen = signature.length == 0 ? store.readShared() : store.balances(address(this));
        Prefund.pay(missing);
        return seen == 12345 ? 1 : 0;
    }

    function validateUserOp(UserOperation06 calldata op, bytes32, uint256 missing)
        external returns (uint256) {
        return _validate(op.signature, missing);
    }

    function validateUserOp(PackedUserOperation07 calldata op, bytes32, uint256 missing)
        external returns (uint256) {
        return _validate(op.signature, missing);
    }

    fallback() external payable {}
}
