// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevToken — a plain ERC-20 for the chaingate devnet.
/// @notice The owner mints, holders burn, anyone airdrops from their own balance.  `airdrop`
/// emits one Transfer per recipient (repeats allowed), so benchmarks can create many transfer
/// logs in few transactions.
contract DevToken {
    string public name;
    string public symbol;
    uint8 public immutable decimals;
    uint256 public totalSupply;
    address public owner;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    error NotOwner();
    error InvalidReceiver();
    error InsufficientBalance();
    error InsufficientAllowance();

    constructor(string memory name_, string memory symbol_, uint8 decimals_, address owner_) {
        name = name_;
        symbol = symbol_;
        decimals = decimals_;
        owner = owner_;
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _move(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            if (allowed < value) revert InsufficientAllowance();
            allowance[from][msg.sender] = allowed - value;
        }
        _move(from, to, value);
        return true;
    }

    function mint(address to, uint256 value) external {
        if (msg.sender != owner) revert NotOwner();
        if (to == address(0)) revert InvalidReceiver();
        totalSupply += value;
        unchecked {
            balanceOf[to] += value; // cannot overflow: totalSupply did not
        }
        emit Transfer(address(0), to, value);
    }

    function burn(uint256 value) external {
        uint256 balance = balanceOf[msg.sender];
        if (balance < value) revert InsufficientBalance();
        unchecked {
            balanceOf[msg.sender] = balance - value;
            totalSupply -= value;
        }
        emit Transfer(msg.sender, address(0), value);
    }

    /// @notice Sends `amount` from the caller to every address of `to`, one Transfer each.
    function airdrop(address[] calldata to, uint256 amount) external {
        uint256 total = amount * to.length;
        uint256 balance = balanceOf[msg.sender];
        if (balance < total) revert InsufficientBalance();
        unchecked {
            balanceOf[msg.sender] = balance - total;
        }
        for (uint256 i; i < to.length; ++i) {
            address receiver = to[i];
            if (receiver == address(0)) revert InvalidReceiver();
            unchecked {
                balanceOf[receiver] += amount; // bounded by the sender's balance
            }
            emit Transfer(msg.sender, receiver, amount);
        }
    }

    function _move(address from, address to, uint256 value) private {
        if (to == address(0)) revert InvalidReceiver();
        uint256 balance = balanceOf[from];
        if (balance < value) revert InsufficientBalance();
        unchecked {
            balanceOf[from] = balance - value;
            balanceOf[to] += value;
        }
        emit Transfer(from, to, value);
    }
}
