// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

// Test contract for the simulation oracle (tests/test_simulation_oracle.py): native currency
// moved between contracts by internal calls, a value transfer undone inside a reverted inner
// call, and each kind of revert (Error(string), Panic, a custom error).

contract SimForwarder {
    error Refused(uint256 code, address who);

    event Forwarded(address indexed to, uint256 value);

    receive() external payable {}

    /// Splits msg.value equally among `to` (the remainder stays here), one internal CALL each.
    function split(address payable[] calldata to) external payable {
        uint256 share = msg.value / to.length;
        for (uint256 i = 0; i < to.length; i++) {
            (bool ok, ) = to[i].call{value: share}("");
            require(ok, "SimForwarder: forward failed");
            emit Forwarded(to[i], share);
        }
    }

    /// Sends half of msg.value to `to`, then calls `sendThenFail`, whose transfer is undone.
    function forwardThenFail(address payable to) external payable {
        (bool ok, ) = to.call{value: msg.value / 2}("");
        require(ok, "SimForwarder: forward failed");
        try this.sendThenFail(to) {} catch {}
    }

    function sendThenFail(address payable to) external {
        (bool ok, ) = to.call{value: 1}("");
        require(ok, "SimForwarder: forward failed");
        revert("SimForwarder: inner refused");
    }

    /// Moves `amount` of `token` from `from` (which approved this contract) to `to`, and pays
    /// `to` the value sent along: a token and native transfer in one call.
    function pull(address token, address from, address payable to, uint256 amount)
        external
        payable
    {
        (bool ok, bytes memory answer) = token.call(
            abi.encodeWithSignature("transferFrom(address,address,uint256)", from, to, amount)
        );
        if (!ok) {
            assembly {
                revert(add(answer, 32), mload(answer))
            }
        }
        (ok, ) = to.call{value: msg.value}("");
        require(ok, "SimForwarder: forward failed");
    }

    function failString() external payable {
        revert("SimForwarder: refused");
    }

    function failPanic(uint256 divisor) external pure returns (uint256) {
        return 10 / divisor;
    }

    function failCustom() external view {
        revert Refused(7, msg.sender);
    }
}
