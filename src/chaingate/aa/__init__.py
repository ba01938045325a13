"""ERC-4337 primitives for EntryPoint v0.6 and v0.7, sans I/O: user operations and their hashes,
the VerifyingPaymaster's signature, SimpleAccount addresses and the calls an operation makes."""
