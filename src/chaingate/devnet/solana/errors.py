"""Solana's words for a TransactionError, as a validator's preflight message says them."""

from __future__ import annotations

_TRANSACTION = {
    "AccountInUse": "Account in use",
    "AccountNotFound": "Attempt to debit an account but found no record of a prior credit.",
    "AlreadyProcessed": "This transaction has already been processed",
    "BlockhashNotFound": "Blockhash not found",
    "InsufficientFundsForFee": "Insufficient funds for fee",
    "InvalidAccountForFee": "This account may not be used to pay transaction fees",
    "ProgramAccountNotFound": "Attempt to load a program that does not exist",
    "SignatureFailure": "Transaction did not pass signature verification",
}
_INSTRUCTION = {
    "InvalidArgument": "invalid program argument",
    "InvalidInstructionData": "invalid instruction data",
    "InvalidAccountData": "invalid account data for instruction",
    "AccountDataTooSmall": "account data too small for instruction",
    "InsufficientFunds": "insufficient funds for instruction",
    "IncorrectProgramId": "incorrect program id for instruction",
    "MissingRequiredSignature": "missing required signature for instruction",
    "AccountAlreadyInitialized": "instruction requires an uninitialized account",
    "UninitializedAccount": "instruction requires an initialized account",
    "NotEnoughAccountKeys": "insufficient account keys for instruction",
    "ProgramFailedToComplete": "Program failed to complete",
    "ComputationalBudgetExceeded": "Computational budget exceeded",
}


def describe(err: object) -> str:
    if isinstance(err, str):
        return _TRANSACTION.get(err, err)
    if isinstance(err, dict) and "InstructionError" in err:
        index, inner = err["InstructionError"]
        if isinstance(inner, dict) and "Custom" in inner:
            text = f"custom program error: {inner['Custom']:#x}"
        else:
            text = _INSTRUCTION.get(str(inner), str(inner))
        return f"Error processing Instruction {index}: {text}"
    if isinstance(err, dict) and "InsufficientFundsForRent" in err:
        index = err["InsufficientFundsForRent"].get("account_index")
        return f"Transaction results in an account ({index}) with insufficient funds for rent"
    return str(err)
