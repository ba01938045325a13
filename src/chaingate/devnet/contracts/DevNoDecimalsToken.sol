// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevNoDecimalsToken — an ERC-20 without `decimals()`.
/// @notice EIP-20 makes `decimals` optional; a call to it reverts here (no such function and
/// no fallback), so metadata readers must cope with its absence.
contract DevNoDecimalsToken {
    string public name;
    string public symbol;
    uint256 public totalSupply;
    address public owner;
    mapping(address => uint256) public balanceOf;

    event Transfer(address indexed from, address indexed to, uint256 value);

    error NotOwner();
    error InsufficientBalance();

    constructor(string memory name_, string memory symbol_, address owner_) {
        name = name_;
        symbol = symbol_;
        owner = owner_;
    }

    function mint(address to, uint256 value) external {
        if (msg.sender != owner) revert NotOwner();
        totalSupply += value;
        unchecked {
            balanceOf[to] += value;
        }
        emit Transfer(address(0), to, value);
    }

    function transfer(address to, uint256 value) external returns (bool) {
        uint256 balance = balanceOf[msg.sender];
        if (balance < value) revert InsufficientBalance();
        unchecked {
            balanceOf[msg.sender] = balance - value;
            balanceOf[to] += value;
        }
        emit Transfer(msg.sender, to, value);
        return true;
    }
}
