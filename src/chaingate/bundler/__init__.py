"""The ERC-4337 bundler: mempool, reputation, simulation, bundling and receipts (issue 16)."""
