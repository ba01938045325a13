// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

interface IERC721Receiver {
    function onERC721Received(address operator, address from, uint256 tokenId, bytes calldata data)
        external
        returns (bytes4);
}

/// @title DevCollection — an ERC-721 (with metadata) for the chaingate devnet.
/// @notice Each token keeps the URI it was minted with, so one collection can show every URI
/// form a metadata reader must handle (data:, ipfs://, https://).  Ids count up from 1.
contract DevCollection {
    string public name;
    string public symbol;
    address public owner;
    uint256 public totalSupply;
    uint256 private _nextId = 1;
    mapping(uint256 => address) private _owners;
    mapping(address => uint256) private _balances;
    mapping(uint256 => address) private _approvals;
    mapping(uint256 => string) private _uris;
    mapping(address => mapping(address => bool)) public isApprovedForAll;

    event Transfer(address indexed from, address indexed to, uint256 indexed tokenId);
    event Approval(address indexed owner, address indexed approved, uint256 indexed tokenId);
    event ApprovalForAll(address indexed owner, address indexed operator, bool approved);

    error NotOwner();
    error NotAuthorized();
    error NonexistentToken(uint256 tokenId);
    error InvalidReceiver();
    error WrongFrom();

    constructor(string memory name_, string memory symbol_, address owner_) {
        name = name_;
        symbol = symbol_;
        owner = owner_;
    }

    function supportsInterface(bytes4 interfaceId) external pure returns (bool) {
        return interfaceId == 0x01ffc9a7 // ERC-165
            || interfaceId == 0x80ac58cd // ERC-721
            || interfaceId == 0x5b5e139f; // ERC-721 metadata
    }

    function balanceOf(address account) external view returns (uint256) {
        if (account == address(0)) revert InvalidReceiver();
        return _balances[account];
    }

    function ownerOf(uint256 tokenId) public view returns (address holder) {
        holder = _owners[tokenId];
        if (holder == address(0)) revert NonexistentToken(tokenId);
    }

    function tokenURI(uint256 tokenId) external view returns (string memory) {
        ownerOf(tokenId);
        return _uris[tokenId];
    }

    function getApproved(uint256 tokenId) external view returns (address) {
        ownerOf(tokenId);
        return _approvals[tokenId];
    }

    function approve(address to, uint256 tokenId) external {
        address holder = ownerOf(tokenId);
        if (msg.sender != holder && !isApprovedForAll[holder][msg.sender]) revert NotAuthorized();
        _approvals[tokenId] = to;
        emit Approval(holder, to, tokenId);
    }

    function setApprovalForAll(address operator, bool approved) external {
        isApprovedForAll[msg.sender][operator] = approved;
        emit ApprovalForAll(msg.sender, operator, approved);
    }

    function transferFrom(address from, address to, uint256 tokenId) public {
        address holder = ownerOf(tokenId);
        if (holder != from) revert WrongFrom();
        if (to == address(0)) revert InvalidReceiver();
        _requireAllowed(holder, tokenId);
        delete _approvals[tokenId];
        unchecked {
            _balances[from] -= 1;
            _balances[to] += 1;
        }
        _owners[tokenId] = to;
        emit Transfer(from, to, tokenId);
    }

    function safeTransferFrom(address from, address to, uint256 tokenId) external {
        safeTransferFrom(from, to, tokenId, "");
    }

    function safeTransferFrom(address from, address to, uint256 tokenId, bytes memory data)
        public
    {
        transferFrom(from, to, tokenId);
        if (to.code.length > 0) {
            bytes4 answer = IERC721Receiver(to).onERC721Received(msg.sender, from, tokenId, data);
            if (answer != IERC721Receiver.onERC721Received.selector) revert InvalidReceiver();
        }
    }

    /// @notice Mints the next id to `to` with its metadata URI; returns the id.
    function mint(address to, string calldata uri) external returns (uint256 tokenId) {
        if (msg.sender != owner) revert NotOwner();
        if (to == address(0)) revert InvalidReceiver();
        tokenId = _nextId++;
        _owners[tokenId] = to;
        _uris[tokenId] = uri;
        unchecked {
            _balances[to] += 1;
            totalSupply += 1;
        }
        emit Transfer(address(0), to, tokenId);
    }

    function burn(uint256 tokenId) external {
        address holder = ownerOf(tokenId);
        _requireAllowed(holder, tokenId);
        delete _approvals[tokenId];
        delete _owners[tokenId];
        delete _uris[tokenId];
        unchecked {
            _balances[holder] -= 1;
            totalSupply -= 1;
        }
        emit Transfer(holder, address(0), tokenId);
    }

    function _requireAllowed(address holder, uint256 tokenId) private view {
        if (
            msg.sender != holder && _approvals[tokenId] != msg.sender
                && !isApprovedForAll[holder][msg.sender]
        ) revert NotAuthorized();
    }
}
