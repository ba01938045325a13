// @solana/kit (with @solana-program/system and @solana-program/token) through chaingate:
// SOL moved, an SPL mint and two associated token accounts made, tokens moved, each confirmed;
// getProgramAccounts with filters, simulateTransaction, a preflight refusal, a batch.
//
// node solana_kit.mjs <rpc url, the key in its path> <ws url with ?apiKey=..., or "-">
//
// With a WebSocket URL, each transaction is sent and confirmed by kit's own
// sendAndConfirmTransactionFactory (signatureSubscribe); with "-", confirmed by polling
// getSignatureStatuses over HTTP.  The last stdout line is a JSON report (u64s as strings)
// that the Python test checks against the node itself.
import {
  appendTransactionMessageInstructions,
  createSolanaRpc,
  createSolanaRpcSubscriptions,
  createTransactionMessage,
  generateKeyPairSigner,
  getBase64EncodedWireTransaction,
  getSignatureFromTransaction,
  lamports,
  pipe,
  sendAndConfirmTransactionFactory,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
} from '@solana/kit';
import { getCreateAccountInstruction, getTransferSolInstruction } from '@solana-program/system';
import {
  TOKEN_PROGRAM_ADDRESS,
  fetchToken,
  findAssociatedTokenPda,
  getCreateAssociatedTokenInstructionAsync,
  getInitializeMint2Instruction,
  getMintSize,
  getMintToInstruction,
  getTransferCheckedInstruction,
} from '@solana-program/token';

const [rpcUrl, wsUrl] = process.argv.slice(2);
const SOL = 1_000_000_000n;
const rpc = createSolanaRpc(rpcUrl);
const subscriptions = wsUrl && wsUrl !== '-' ? createSolanaRpcSubscriptions(wsUrl) : null;
const sendAndConfirm = subscriptions
  ? sendAndConfirmTransactionFactory({ rpc, rpcSubscriptions: subscriptions })
  : null;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function confirmByPolling(signature) {
  for (let i = 0; i < 400; i++) {
    const { value } = await rpc.getSignatureStatuses([signature]).send();
    const status = value[0];
    if (status && status.err) throw new Error(`${signature} failed: ${JSON.stringify(status.err)}`);
    if (status && ['confirmed', 'finalized'].includes(status.confirmationStatus)) return status;
    await sleep(50);
  }
  throw new Error(`${signature} not confirmed in 20 s`);
}

async function build(payer, instructions) {
  const { value: blockhash } = await rpc.getLatestBlockhash({ commitment: 'confirmed' }).send();
  const message = pipe(
    createTransactionMessage({ version: 0 }),
    (m) => setTransactionMessageFeePayerSigner(payer, m),
    (m) => setTransactionMessageLifetimeUsingBlockhash(blockhash, m),
    (m) => appendTransactionMessageInstructions(instructions, m),
  );
  return signTransactionMessageWithSigners(message);
}

async function send(payer, instructions) {
  const tx = await build(payer, instructions);
  const signature = getSignatureFromTransaction(tx);
  if (sendAndConfirm) {
    await sendAndConfirm(tx, { commitment: 'confirmed' });
  } else {
    const sent = await rpc
      .sendTransaction(getBase64EncodedWireTransaction(tx), { encoding: 'base64' })
      .send();
    if (sent !== signature) throw new Error(`sendTransaction answered ${sent}, not ${signature}`);
    await confirmByPolling(signature);
  }
  return signature;
}

const payer = await generateKeyPairSigner();
const bob = await generateKeyPairSigner();
const mint = await generateKeyPairSigner();
const report = { payer: payer.address, bob: bob.address, mint: mint.address };

// Funds: an airdrop, confirmed like any transaction.
const airdrop = await rpc.requestAirdrop(payer.address, lamports(5n * SOL)).send();
await confirmByPolling(airdrop);
report.airdropped = String((await rpc.getBalance(payer.address, { commitment: 'confirmed' }).send()).value);

// SOL.
report.transfer = await send(payer, [
  getTransferSolInstruction({ source: payer, destination: bob.address, amount: lamports(SOL) }),
]);
report.bobLamports = String((await rpc.getBalance(bob.address, { commitment: 'confirmed' }).send()).value);

// An SPL mint, the associated token accounts of payer and bob, a mint, a checked transfer.
const space = BigInt(getMintSize());
const rent = await rpc.getMinimumBalanceForRentExemption(space).send();
const [payerAta] = await findAssociatedTokenPda({
  mint: mint.address, owner: payer.address, tokenProgram: TOKEN_PROGRAM_ADDRESS,
});
const [bobAta] = await findAssociatedTokenPda({
  mint: mint.address, owner: bob.address, tokenProgram: TOKEN_PROGRAM_ADDRESS,
});
report.payerAta = payerAta;
report.bobAta = bobAta;
report.createMint = await send(payer, [
  getCreateAccountInstruction({
    payer, newAccount: mint, lamports: rent, space, programAddress: TOKEN_PROGRAM_ADDRESS,
  }),
  getInitializeMint2Instruction({ mint: mint.address, decimals: 6, mintAuthority: payer.address }),
  await getCreateAssociatedTokenInstructionAsync({ payer, mint: mint.address, owner: payer.address }),
  await getCreateAssociatedTokenInstructionAsync({ payer, mint: mint.address, owner: bob.address }),
  getMintToInstruction({ mint: mint.address, token: payerAta, mintAuthority: payer, amount: 5_000_000n }),
]);
report.tokenTransfer = await send(payer, [
  getTransferCheckedInstruction({
    source: payerAta, mint: mint.address, destination: bobAta, authority: payer,
    amount: 1_250_000n, decimals: 6,
  }),
]);
const bobToken = await fetchToken(rpc, bobAta, { commitment: 'confirmed' });
report.bobTokens = String(bobToken.data.amount);
report.bobTokenOwner = bobToken.data.owner;
report.tokenBalance = (await rpc.getTokenAccountBalance(bobAta, { commitment: 'confirmed' }).send()).value;

// getProgramAccounts: 165-byte token accounts of this mint (the mint at offset 0).
const holders = await rpc
  .getProgramAccounts(TOKEN_PROGRAM_ADDRESS, {
    commitment: 'confirmed',
    encoding: 'base64',
    filters: [
      { dataSize: 165n },
      { memcmp: { offset: 0n, bytes: mint.address, encoding: 'base58' } },
    ],
  })
  .send();
report.holders = holders.map((entry) => entry.pubkey).sort();

// simulateTransaction: a transfer bob cannot afford; then sending it is refused in preflight.
const tooMuch = await build(bob, [
  getTransferSolInstruction({ source: bob, destination: payer.address, amount: lamports(50n * SOL) }),
]);
const wire = getBase64EncodedWireTransaction(tooMuch);
const simulated = await rpc
  .simulateTransaction(wire, { encoding: 'base64', sigVerify: true, commitment: 'confirmed' })
  .send();
report.simulatedErr = simulated.value.err;
report.simulatedLogs = simulated.value.logs;
try {
  await rpc.sendTransaction(wire, { encoding: 'base64' }).send();
  report.refusal = null;
} catch (error) {
  report.refusal = { message: String(error.message), context: JSON.parse(
    JSON.stringify(error.context ?? {}, (_, v) => (typeof v === 'bigint' ? String(v) : v))) };
}

// A batch (kit sends one call a request: a JSON-RPC batch is posted as any client would).
const batch = await fetch(rpcUrl, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify([
    { jsonrpc: '2.0', id: 1, method: 'getBalance', params: [bob.address, { commitment: 'confirmed' }] },
    { jsonrpc: '2.0', id: 2, method: 'getTokenAccountBalance', params: [bobAta, { commitment: 'confirmed' }] },
    { jsonrpc: '2.0', id: 3, method: 'getSlot', params: [{ commitment: 'confirmed' }] },
  ]),
});
report.batch = await batch.json();
report.confirmedBy = sendAndConfirm ? 'signatureSubscribe' : 'getSignatureStatuses';
subscriptions?.close?.();
console.log(JSON.stringify(report, (_, v) => (typeof v === 'bigint' ? String(v) : v)));
process.exit(0);
