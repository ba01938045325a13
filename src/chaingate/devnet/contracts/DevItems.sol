// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

interface IERC1155Receiver {
    function onERC1155Received(
        address operator,
        address from,
        uint256 id,
        uint256 value,
        bytes calldata data
    ) external returns (bytes4);

    function onERC1155BatchReceived(
        address operator,
        address from,
        uint256[] calldata ids,
        uint256[] calldata values,
        bytes calldata data
    ) external returns (bytes4);
}

/// @title DevItems — an ERC-1155 (with metadata URI) for the chaingate devnet.
/// @notice `uri(id)` is the URI an id was first minted with, else the shared template with the
/// standard's literal `{id}` placeholder, which clients substitute themselves.
contract DevItems {
    address public owner;
    string private _template;
    mapping(uint256 => string) private _uris;
    mapping(uint256 => mapping(address => uint256)) private _balances;
    mapping(address => mapping(address => bool)) public isApprovedForAll;

    event TransferSingle(
        address indexed operator, address indexed from, address indexed to, uint256 id, uint256 value
    );
    event TransferBatch(
        address indexed operator,
        address indexed from,
        address indexed to,
        uint256[] ids,
        uint256[] values
    );
    event ApprovalForAll(address indexed account, address indexed operator, bool approved);
    event URI(string value, uint256 indexed id);

    error NotOwner();
    error NotAuthorized();
    error InvalidReceiver();
    error InsufficientBalance();
    error LengthMismatch();

    constructor(string memory template, address owner_) {
        _template = template;
        owner = owner_;
    }

    function supportsInterface(bytes4 interfaceId) external pure returns (bool) {
        return interfaceId == 0x01ffc9a7 // ERC-165
            || interfaceId == 0xd9b67a26 // ERC-1155
            || interfaceId == 0x0e89341c; // ERC-1155 metadata URI
    }

    function uri(uint256 id) external view returns (string memory) {
        string memory own = _uris[id];
        return bytes(own).length > 0 ? own : _template;
    }

    function balanceOf(address account, uint256 id) external view returns (uint256) {
        return _balances[id][account];
    }

    function balanceOfBatch(address[] calldata accounts, uint256[] calldata ids)
        external
        view
        returns (uint256[] memory balances)
    {
        if (accounts.length != ids.length) revert LengthMismatch();
        balances = new uint256[](accounts.length);
        for (uint256 i; i < accounts.length; ++i) {
            balances[i] = _balances[ids[i]][accounts[i]];
        }
    }

    function setApprovalForAll(address operator, bool approved) external {
        isApprovedForAll[msg.sender][operator] = approved;
        emit ApprovalForAll(msg.sender, operator, approved);
    }

    function safeTransferFrom(address from, address to, uint256 id, uint256 value, bytes calldata data)
        external
    {
        _requireAllowed(from);
        if (to == address(0)) revert InvalidReceiver();
        _debit(from, id, value);
        _balances[id][to] += value;
        emit TransferSingle(msg.sender, from, to, id, value);
        _checkSingle(from, to, id, value, data);
    }

    function safeBatchTransferFrom(
        address from,
        address to,
        uint256[] calldata ids,
        uint256[] calldata values,
        bytes calldata data
    ) external {
        _requireAllowed(from);
        if (to == address(0)) revert InvalidReceiver();
        if (ids.length != values.length) revert LengthMismatch();
        for (uint256 i; i < ids.length; ++i) {
            _debit(from, ids[i], values[i]);
            _balances[ids[i]][to] += values[i];
        }
        emit TransferBatch(msg.sender, from, to, ids, values);
        if (to.code.length > 0) {
            bytes4 answer =
                IERC1155Receiver(to).onERC1155BatchReceived(msg.sender, from, ids, values, data);
            if (answer != IERC1155Receiver.onERC1155BatchReceived.selector) revert InvalidReceiver();
        }
    }

    /// @notice Mints `value` of `id` to `to`; a non-empty `uri_` becomes that id's own URI.
    function mint(address to, uint256 id, uint256 value, string calldata uri_) external {
        if (msg.sender != owner) revert NotOwner();
        if (to == address(0)) revert InvalidReceiver();
        if (bytes(uri_).length > 0 && bytes(_uris[id]).length == 0) {
            _uris[id] = uri_;
            emit URI(uri_, id);
        }
        _balances[id][to] += value;
        emit TransferSingle(msg.sender, address(0), to, id, value);
        _checkSingle(address(0), to, id, value, "");
    }

    function burn(address from, uint256 id, uint256 value) external {
        _requireAllowed(from);
        _debit(from, id, value);
        emit TransferSingle(msg.sender, from, address(0), id, value);
    }

    function _requireAllowed(address from) private view {
        if (from != msg.sender && !isApprovedForAll[from][msg.sender]) revert NotAuthorized();
    }

    function _debit(address from, uint256 id, uint256 value) private {
        uint256 balance = _balances[id][from];
        if (balance < value) revert InsufficientBalance();
        unchecked {
            _balances[id][from] = balance - value;
        }
    }

    function _checkSingle(address from, address to, uint256 id, uint256 value, bytes memory data)
        private
    {
        if (to.code.length > 0) {
            bytes4 answer = IERC1155Receiver(to).onERC1155Received(msg.sender, from, id, value, data);
            if (answer != IERC1155Receiver.onERC1155Received.selector) revert InvalidReceiver();
        }
    }
}
