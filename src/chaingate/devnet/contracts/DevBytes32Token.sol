// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevBytes32Token — an ERC-20 whose `name()` and `symbol()` return bytes32.
/// @notice Like MKR and other early tokens: metadata readers must decode the right-padded
/// bytes32 to text instead of showing hex.
contract DevBytes32Token {
    bytes32 public immutable name;
    bytes32 public immutable symbol;
    uint8 public constant decimals = 18;
    uint256 public totalSupply;
    address public owner;
    mapping(address => uint256) public balanceOf;

    event Transfer(address indexed from, address indexed to, uint256 value);

    error NotOwner();
    error InsufficientBalance();

    constructor(bytes32 name_, bytes32 symbol_, address owner_) {
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
