// A permissionless.js SimpleAccount sent through an ERC-4337 bundler by viem's bundler actions:
// the bundler estimates the gas, accepts the operation, bundles it; the account is deployed by
// its first operation, which also executes one call (send `--value` wei to `--to`).  With
// --eip7702 (EntryPoint 0.8) the account is the owner's own EOA (to7702SimpleSmartAccount):
// its first operation carries the EIP-7702 authorization viem signs, delegating the EOA to
// the canonical Simple7702Account.
//
//   node bundler_permissionless.mjs --bundler <url> --rpc <node url> --entry-point <0.6|0.7|0.8>
//        --owner-key <0x private key> [--eip7702] [--index N] [--to <address>] [--value <wei>]
//        [--policy <policy id>] [--api-key <key>] [--timeout-ms N]
//
// With --policy the operation is sponsored by the ERC-7677 paymaster methods (pm_*) answered
// on the bundler URL, context {policyId}; without it the account pays its own prefund (the
// caller funds its counterfactual address first).  --api-key goes in X-API-Key to the bundler.
//
// Prints one JSON line: account, userOpHash, success, transactionHash, actualGasUsed,
// actualGasCost, blockNumber, paymaster, entryPoint, seconds (send to receipt).
import { parseArgs } from "node:util";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import {
  createPaymasterClient,
  entryPoint06Address,
  entryPoint07Address,
  entryPoint08Address,
} from "viem/account-abstraction";
import { foundry } from "viem/chains";
import { createSmartAccountClient } from "permissionless";
import { to7702SimpleSmartAccount, toSimpleSmartAccount } from "permissionless/accounts";

const { values: args } = parseArgs({
  options: {
    bundler: { type: "string" },
    rpc: { type: "string" },
    "entry-point": { type: "string" },
    "owner-key": { type: "string" },
    eip7702: { type: "boolean", default: false },
    index: { type: "string", default: "0" },
    to: { type: "string", default: "0x000000000000000000000000000000000000dEaD" },
    value: { type: "string", default: "1" },
    policy: { type: "string" },
    "api-key": { type: "string" },
    "timeout-ms": { type: "string", default: "60000" },
  },
  strict: true,
});
for (const required of ["bundler", "rpc", "entry-point", "owner-key"]) {
  if (!args[required]) {
    console.error(`missing --${required}`);
    process.exit(2);
  }
}
const version = args["entry-point"];
const addresses = { "0.6": entryPoint06Address, "0.7": entryPoint07Address, "0.8": entryPoint08Address };
if (!(version in addresses)) {
  console.error(`--entry-point must be 0.6, 0.7 or 0.8, not ${version}`);
  process.exit(2);
}
if (args.eip7702 && version !== "0.8") {
  console.error("--eip7702 needs --entry-point 0.8");
  process.exit(2);
}
const entryPoint = { address: addresses[version], version };
const fetchOptions = args["api-key"] ? { headers: { "X-API-Key": args["api-key"] } } : {};
const bundlerTransport = http(args.bundler, { fetchOptions, timeout: 30_000 });

const client = createPublicClient({ chain: foundry, transport: http(args.rpc) });
const owner = privateKeyToAccount(args["owner-key"]);
const account = args.eip7702
  ? await to7702SimpleSmartAccount({ client, owner, entryPoint })
  : await toSimpleSmartAccount({ client, owner, entryPoint, index: BigInt(args.index) });
const sponsored = args.policy
  ? {
      paymaster: createPaymasterClient({ transport: bundlerTransport }),
      paymasterContext: { policyId: args.policy },
    }
  : {};
const smartAccountClient = createSmartAccountClient({
  account,
  chain: foundry,
  client,
  bundlerTransport,
  ...sponsored,
  userOperation: {
    // The node's own fee estimate (base fee x 1.2 + its priority fee): no vendor gas-price
    // method, so any bundler answering the standard methods will do.
    estimateFeesPerGas: async () => client.estimateFeesPerGas(),
  },
});

// An EIP-7702 account not delegated yet sends its authorization (signed by the owner over
// its next account nonce) with its first operation; viem's own is a stub for estimation.
let authorization;
if (args.eip7702 && !(await account.isDeployed())) {
  authorization = await owner.signAuthorization({
    address: account.implementation,
    chainId: foundry.id,
    nonce: await client.getTransactionCount({ address: owner.address }),
  });
}

const started = performance.now();
const userOpHash = await smartAccountClient.sendUserOperation({
  calls: [{ to: args.to, value: BigInt(args.value), data: "0x" }],
  ...(authorization ? { authorization } : {}),
});
const receipt = await smartAccountClient.waitForUserOperationReceipt({
  hash: userOpHash,
  timeout: Number(args["timeout-ms"]),
  pollingInterval: 100,
});
const seconds = (performance.now() - started) / 1000;
console.log(
  JSON.stringify({
    account: account.address,
    userOpHash,
    success: receipt.success,
    transactionHash: receipt.receipt.transactionHash,
    actualGasUsed: receipt.actualGasUsed.toString(),
    actualGasCost: receipt.actualGasCost.toString(),
    blockNumber: receipt.receipt.blockNumber.toString(),
    paymaster: receipt.paymaster ?? null,
    entryPoint: receipt.entryPoint,
    seconds,
  }),
);
