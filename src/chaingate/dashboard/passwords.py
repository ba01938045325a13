"""Passwords hashed with scrypt (``hashlib.scrypt``, RFC 7914): memory-hard, in the standard
library, so no native dependency is added for it.

A hash is stored as ``scrypt$N$r$p$salt$hash`` (salt and hash in unpadded base64url), so the
cost can be raised later and old hashes still verify.  Hashing takes ~16 MiB and tens of
milliseconds: callers run it on a worker thread.

A new password (``check_strength``, wherever one is set: the dashboard's account page,
``chaingate accounts set-password``) follows OWASP ASVS 4 level 2 (V2.1): at least 12
characters, any characters (spaces too: a passphrase of a few words is the easy strong one),
no composition rules, and none of the common and breached passwords of the list shipped in
``data/common-passwords.txt.gz`` (data/README.md says which list, its licence and size).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import secrets
from importlib import resources

N, R, P = 2**14, 8, 1
_DKLEN = 32
MIN_LENGTH = 12  # ASVS 2.1.1
MAX_LENGTH = 1024  # bounded input: scrypt reads all of it
COMMON_PASSWORDS = "data/common-passwords.txt.gz"  # in this package (data/README.md)


class PasswordRejected(ValueError):
    """A password this deployment does not accept (the message says why)."""


def check_strength(password: str) -> None:
    if len(password) < MIN_LENGTH:
        raise PasswordRejected(f"a password needs at least {MIN_LENGTH} characters")
    if len(password) > MAX_LENGTH:
        raise PasswordRejected(f"a password has at most {MAX_LENGTH} characters")
    if is_common(password):
        raise PasswordRejected(
            "this password is on a list of common and breached passwords: choose another "
            "(a few unrelated words make a long one that is easy to remember)"
        )


def is_common(password: str) -> bool:
    """Whether ``password`` (in any letter case) is on the shipped list.  The list is read
    for each check and not kept: passwords are set rarely, and 640 KB would stay resident
    for it (a read and a search take a few milliseconds)."""
    packed = resources.files("chaingate.dashboard").joinpath(COMMON_PASSWORDS).read_bytes()
    needle = b"\n" + password.lower().encode() + b"\n"
    return needle in b"\n" + gzip.decompress(packed)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=N, r=R, p=P, maxmem=64 * 1024 * 1024, dklen=_DKLEN
    )
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(digest)}"


# Verified when an e-mail has no password, so both cases cost the same time.
_DUMMY = hash_password(secrets.token_urlsafe(16))


def verify_password(password: str, stored: str | None) -> bool:
    """Whether ``password`` matches ``stored`` (None: no password set; the work is done all
    the same, so the answer's timing does not tell whether the account exists)."""
    if len(password) > MAX_LENGTH:
        return False
    candidate = stored or _DUMMY
    try:
        scheme, n, r, p, salt, digest = candidate.split("$")
        if scheme != "scrypt":
            return False
        expected = _unb64(digest)
        got = hashlib.scrypt(
            password.encode(),
            salt=_unb64(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=64 * 1024 * 1024,
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected) and stored is not None
