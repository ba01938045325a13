// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title DevUpdatableCollection — an ERC-721 with ERC-4906 metadata updates and an ERC-7572
/// `contractURI`.
/// @notice `tokenURI(id)` is the token's own URI when set, else base URI + decimal id.
/// Changing one token's URI emits `MetadataUpdate(id)`; changing the base URI emits
/// `BatchMetadataUpdate(1, last minted id)`; changing the contract URI emits
/// `ContractURIUpdated()`.  Ids count up from 1.
contract DevUpdatableCollection {
    string public name;
    string public symbol;
    address public owner;
    uint256 public totalSupply;
    uint256 private _nextId = 1;
    string private _baseURI;
    string private _contractURI;
    mapping(uint256 => address) private _owners;
    mapping(address => uint256) private _balances;
    mapping(uint256 => string) private _uris;

    event Transfer(address indexed from, address indexed to, uint256 indexed tokenId);
    event MetadataUpdate(uint256 _tokenId);
    event BatchMetadataUpdate(uint256 _fromTokenId, uint256 _toTokenId);
    event ContractURIUpdated();

    error NotOwner();
    error NotAuthorized();
    error NonexistentToken(uint256 tokenId);
    error InvalidReceiver();

    constructor(
        string memory name_,
        string memory symbol_,
        string memory baseURI_,
        string memory contractURI_,
        address owner_
    ) {
        name = name_;
        symbol = symbol_;
        _baseURI = baseURI_;
        _contractURI = contractURI_;
        owner = owner_;
    }

    function supportsInterface(bytes4 interfaceId) external pure returns (bool) {
        return interfaceId == 0x01ffc9a7 // ERC-165
            || interfaceId == 0x80ac58cd // ERC-721
            || interfaceId == 0x5b5e139f // ERC-721 metadata
            || interfaceId == 0x49064906; // ERC-4906
    }

    function contractURI() external view returns (string memory) {
        return _contractURI;
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
        string memory own = _uris[tokenId];
        if (bytes(own).length > 0) return own;
        return string.concat(_baseURI, _decimal(tokenId));
    }

    function transferFrom(address from, address to, uint256 tokenId) external {
        address holder = ownerOf(tokenId);
        if (holder != from || msg.sender != holder) revert NotAuthorized();
        if (to == address(0)) revert InvalidReceiver();
        unchecked {
            _balances[from] -= 1;
            _balances[to] += 1;
        }
        _owners[tokenId] = to;
        emit Transfer(from, to, tokenId);
    }

    function mint(address to) external returns (uint256 tokenId) {
        if (msg.sender != owner) revert NotOwner();
        if (to == address(0)) revert InvalidReceiver();
        tokenId = _nextId++;
        _owners[tokenId] = to;
        unchecked {
            _balances[to] += 1;
            totalSupply += 1;
        }
        emit Transfer(address(0), to, tokenId);
    }

    function setTokenURI(uint256 tokenId, string calldata uri) external {
        if (msg.sender != owner) revert NotOwner();
        ownerOf(tokenId);
        _uris[tokenId] = uri;
        emit MetadataUpdate(tokenId);
    }

    function setBaseURI(string calldata baseURI_) external {
        if (msg.sender != owner) revert NotOwner();
        _baseURI = baseURI_;
        emit BatchMetadataUpdate(1, _nextId - 1);
    }

    function setContractURI(string calldata contractURI_) external {
        if (msg.sender != owner) revert NotOwner();
        _contractURI = contractURI_;
        emit ContractURIUpdated();
    }

    function _decimal(uint256 value) private pure returns (string memory) {
        if (value == 0) return "0";
        uint256 digits;
        for (uint256 v = value; v != 0; v /= 10) {
            ++digits;
        }
        bytes memory text = new bytes(digits);
        for (; value != 0; value /= 10) {
            text[--digits] = bytes1(uint8(48 + value % 10));
        }
        return string(text);
    }
}
