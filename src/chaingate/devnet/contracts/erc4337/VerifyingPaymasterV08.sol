// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

// chaingate's VerifyingPaymaster for EntryPoint v0.8: npm @account-abstraction/contracts 0.8.0
// ships none (its sample moved out of the package).  It signs and checks what the v0.7 sample
// does, so chaingate.aa.paymaster's v0.7 hash serves both: paymasterData is
// abi.encode(uint48 validUntil, uint48 validAfter) ++ a signature by `verifyingSigner` over
// the EIP-191 message of getHash(userOp, validUntil, validAfter).

import "@account-abstraction/contracts/core/BasePaymaster.sol";
import "@account-abstraction/contracts/core/Helpers.sol";
import "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";

contract VerifyingPaymasterV08 is BasePaymaster {
    address public immutable verifyingSigner;

    uint256 private constant TIMESTAMPS_AT = PAYMASTER_DATA_OFFSET;
    uint256 private constant SIGNATURE_AT = TIMESTAMPS_AT + 64;

    constructor(IEntryPoint entryPoint_, address signer) BasePaymaster(entryPoint_) {
        verifyingSigner = signer;
    }

    /// What the signer signs: every field but the signature and paymasterData (which holds it).
    function getHash(PackedUserOperation calldata userOp, uint48 validUntil, uint48 validAfter)
        public view returns (bytes32)
    {
        bytes calldata pmd = userOp.paymasterAndData;
        return keccak256(
            abi.encode(
                userOp.sender,
                userOp.nonce,
                keccak256(userOp.initCode),
                keccak256(userOp.callData),
                userOp.accountGasLimits,
                uint256(bytes32(pmd[PAYMASTER_VALIDATION_GAS_OFFSET:PAYMASTER_DATA_OFFSET])),
                userOp.preVerificationGas,
                userOp.gasFees,
                block.chainid,
                address(this),
                validUntil,
                validAfter
            )
        );
    }

    function _validatePaymasterUserOp(PackedUserOperation calldata userOp, bytes32, uint256)
        internal view override returns (bytes memory context, uint256 validationData)
    {
        (uint48 validUntil, uint48 validAfter, bytes calldata signature) =
            parsePaymasterAndData(userOp.paymasterAndData);
        require(signature.length == 64 || signature.length == 65, "VerifyingPaymaster: signature length");
        bytes32 digest = MessageHashUtils.toEthSignedMessageHash(getHash(userOp, validUntil, validAfter));
        bool failed = ECDSA.recover(digest, signature) != verifyingSigner;
        return ("", _packValidationData(failed, validUntil, validAfter));
    }

    function parsePaymasterAndData(bytes calldata paymasterAndData)
        public pure returns (uint48 validUntil, uint48 validAfter, bytes calldata signature)
    {
        (validUntil, validAfter) = abi.decode(paymasterAndData[TIMESTAMPS_AT:], (uint48, uint48));
        signature = paymasterAndData[SIGNATURE_AT:];
    }
}
