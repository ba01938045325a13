// viem's own client calling chaingate's simulation methods: Alchemy's names and chaingate's, for
// one transaction, a bundle and an execution trace, as a dapp written for Alchemy would.
//
//   node simulation_viem.mjs <rpc url> <transaction JSON>
//
// Prints one JSON line: {name: {alias, own}} with each method's result.
import { createPublicClient, http } from "viem";

const [url, txJson] = process.argv.slice(2);
const tx = JSON.parse(txJson);
const client = createPublicClient({ transport: http(url, { retryCount: 0 }) });

const calls = {
  simulateAssetChanges: [tx],
  simulateAssetChangesBundle: [[tx, tx]],
  simulateExecution: ["NESTED", tx, "latest"],
};
const answers = {};
for (const [name, params] of Object.entries(calls)) {
  answers[name] = {
    alias: await client.request({ method: `alchemy_${name}`, params }),
    own: await client.request({ method: `chaingate_${name}`, params }),
  };
}
console.log(JSON.stringify(answers));
