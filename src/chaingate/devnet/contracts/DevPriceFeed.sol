// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevPriceFeed — a Chainlink-style price feed (AggregatorV3Interface) for the devnet.
/// @notice The owner pushes answers; each push is a new round, readable like a Chainlink feed.
contract DevPriceFeed {
    struct Round {
        int256 answer;
        uint64 startedAt;
        uint64 updatedAt;
    }

    uint8 public immutable decimals;
    uint256 public constant version = 4;
    string public description;
    address public owner;
    uint80 public latestRound;
    mapping(uint80 => Round) private _rounds;

    event AnswerUpdated(int256 indexed current, uint256 indexed roundId, uint256 updatedAt);
    event NewRound(uint256 indexed roundId, address indexed startedBy, uint256 startedAt);

    error NotOwner();
    error NoDataPresent();

    constructor(uint8 decimals_, string memory description_, int256 answer, address owner_) {
        decimals = decimals_;
        description = description_;
        owner = owner_;
        _push(answer);
    }

    function updateAnswer(int256 answer) external {
        if (msg.sender != owner) revert NotOwner();
        _push(answer);
    }

    function latestAnswer() external view returns (int256) {
        return _rounds[latestRound].answer;
    }

    function getRoundData(uint80 roundId)
        public
        view
        returns (uint80, int256 answer, uint256 startedAt, uint256 updatedAt, uint80)
    {
        Round memory round = _rounds[roundId];
        if (round.updatedAt == 0) revert NoDataPresent();
        return (roundId, round.answer, round.startedAt, round.updatedAt, roundId);
    }

    function latestRoundData()
        external
        view
        returns (uint80, int256, uint256, uint256, uint80)
    {
        return getRoundData(latestRound);
    }

    function _push(int256 answer) private {
        uint80 roundId = ++latestRound;
        _rounds[roundId] = Round(answer, uint64(block.timestamp), uint64(block.timestamp));
        emit NewRound(roundId, msg.sender, block.timestamp);
        emit AnswerUpdated(answer, roundId, block.timestamp);
    }
}
