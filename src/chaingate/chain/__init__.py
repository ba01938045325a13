"""Chain data: the internal JSON-RPC client, block and log types, and the reorg-aware follower."""
