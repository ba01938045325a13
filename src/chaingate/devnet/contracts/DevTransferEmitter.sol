// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevTransferEmitter — emits ERC-20-shaped Transfer logs without being a token.
/// @notice No token function at all (calls to `totalSupply`, `balanceOf`, `decimals`... revert):
/// an indexer that trusts the event signature alone would list it as a token.
contract DevTransferEmitter {
    event Transfer(address indexed from, address indexed to, uint256 value);

    function emitTransfer(address from, address to, uint256 value) external {
        emit Transfer(from, to, value);
    }
}
