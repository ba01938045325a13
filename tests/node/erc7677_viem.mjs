// A UserOperation sponsored through chaingate's ERC-7677 endpoint by viem's paymaster client,
// for a permissionless.js SimpleAccount, then submitted by a plain EOA with handleOps (no
// bundler: the gas limits are given, so none is asked to estimate).
//
//   node erc7677_viem.mjs <anvil url> <paymaster url> <api key> <policy id> <0.6|0.7>
//                         <owner private key> <target> <calldata>
//
// Prints one JSON line: the account's address, the operation's hash, the transaction.
import { createPublicClient, createWalletClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import {
  createBundlerClient,
  createPaymasterClient,
  entryPoint06Abi,
  entryPoint06Address,
  entryPoint07Abi,
  entryPoint07Address,
  getUserOperationHash,
  toPackedUserOperation,
} from "viem/account-abstraction";
import { foundry } from "viem/chains";
import { toSimpleSmartAccount } from "permissionless/accounts";

const [anvilUrl, paymasterUrl, apiKey, policyId, version, ownerKey, target, data] =
  process.argv.slice(2);
const entryPoint =
  version === "0.6"
    ? { address: entryPoint06Address, version: "0.6", abi: entryPoint06Abi }
    : { address: entryPoint07Address, version: "0.7", abi: entryPoint07Abi };

const client = createPublicClient({ chain: foundry, transport: http(anvilUrl) });
const account = await toSimpleSmartAccount({
  client,
  owner: privateKeyToAccount(ownerKey),
  entryPoint: { address: entryPoint.address, version: entryPoint.version },
});
const paymaster = createPaymasterClient({
  transport: http(paymasterUrl, { fetchOptions: { headers: { "X-API-Key": apiKey } } }),
});
const bundler = createBundlerClient({
  account,
  client,
  chain: foundry,
  paymaster,
  paymasterContext: { policyId },
  // Never reached: every gas value is given below.
  transport: http(paymasterUrl, { fetchOptions: { headers: { "X-API-Key": apiKey } } }),
});
const gwei = 1_000_000_000n;
const prepared = await bundler.prepareUserOperation({
  calls: [{ to: target, value: 0n, data }],
  callGasLimit: 200_000n,
  verificationGasLimit: 1_000_000n,
  preVerificationGas: 60_000n,
  maxFeePerGas: 3n * gwei,
  maxPriorityFeePerGas: gwei,
});
const signature = await account.signUserOperation(prepared);
const userOperation = { ...prepared, signature };
const [submitter] = await client.request({ method: "eth_accounts" });
const wallet = createWalletClient({ chain: foundry, account: submitter, transport: http(anvilUrl) });
const ops = version === "0.6" ? [userOperation] : [toPackedUserOperation(userOperation)];
const hash = await wallet.writeContract({
  address: entryPoint.address,
  abi: entryPoint.abi,
  functionName: "handleOps",
  args: [ops, submitter],
  gas: 3_000_000n,
});
const receipt = await client.waitForTransactionReceipt({ hash });
const userOpHash = getUserOperationHash({
  userOperation,
  entryPointAddress: entryPoint.address,
  entryPointVersion: entryPoint.version,
  chainId: foundry.id,
});
console.log(
  JSON.stringify({
    sender: account.address,
    userOpHash,
    transaction: hash,
    status: receipt.status,
    paymaster: prepared.paymaster ?? prepared.paymasterAndData?.slice(0, 42),
  }),
);
