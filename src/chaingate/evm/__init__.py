"""EVM primitives chaingate needs itself: keccak, addresses, secp256k1 keys, ABI coding."""
