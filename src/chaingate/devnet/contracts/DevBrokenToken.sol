// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevBrokenToken — an ERC-20 whose `balanceOf` always reverts.
/// @notice Name, symbol, decimals and supply answer; balances never do (a paused or
/// misbehaving token).  Readers must skip its balances without failing the others.
contract DevBrokenToken {
    string public name;
    string public symbol;
    uint8 public constant decimals = 18;
    uint256 public totalSupply;
    address public owner;
    mapping(address => uint256) private _balances;

    event Transfer(address indexed from, address indexed to, uint256 value);

    error NotOwner();
    error BalancesUnavailable();

    constructor(string memory name_, string memory symbol_, address owner_) {
        name = name_;
        symbol = symbol_;
        owner = owner_;
    }

    function balanceOf(address) external pure returns (uint256) {
        revert BalancesUnavailable();
    }

    function mint(address to, uint256 value) external {
        if (msg.sender != owner) revert NotOwner();
        totalSupply += value;
        _balances[to] += value;
        emit Transfer(address(0), to, value);
    }
}
