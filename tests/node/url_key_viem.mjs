// viem given nothing but a URL (the key at the end of the path): a block number, a batch of
// calls over that URL, and what viem reports when the key in the URL is refused.
//
//   node url_key_viem.mjs <rpc url with key> <rpc url with a wrong key>
//
// Prints one JSON line.
import { createPublicClient, http } from "viem";

const [goodUrl, badUrl] = process.argv.slice(2);
const client = createPublicClient({ transport: http(goodUrl) });
const batched = createPublicClient({ transport: http(goodUrl, { batch: true }) });
const refused = createPublicClient({ transport: http(badUrl, { retryCount: 0 }) });

const blockNumber = await client.getBlockNumber();
const [chainId, again] = await Promise.all([batched.getChainId(), batched.getBlockNumber()]);
let refusal = null;
try {
  await refused.getBlockNumber();
} catch (error) {
  refusal = { status: error.status ?? error.cause?.status ?? null, message: String(error.message) };
}
console.log(
  JSON.stringify({
    blockNumber: blockNumber.toString(),
    chainId,
    again: again.toString(),
    refusal,
  }),
);
