"""Each subsystem owns its tables: no module names, in SQL, a table of another package, and
each table's migrations live beside its owner.

A table's rows are read and written only by the package that owns it (its ``store.py`` or
rows module); another subsystem asks that package's rows class or service.  The test reads
every SQL string in ``src/chaingate`` (string literals holding a statement keyword) and
checks each table it names after ``FROM``, ``JOIN``, ``INTO``, ``UPDATE`` or ``TABLE``; and
every migration file, whose tables must be its package's.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from chaingate.store.migrate import load_migrations

SRC = Path(__file__).resolve().parent.parent / "src" / "chaingate"

# Package (under chaingate/) -> the tables it owns.
OWNERS: dict[str, tuple[str, ...]] = {
    "store": ("schema_migrations", "chain_identities"),
    "auth": (
        "accounts",
        "api_keys",
        "usage_minutes",
        "usage_hours",
        "usage_days",
        "usage_latency",
    ),
    "chain": ("chain_blocks", "chain_cursors", "chain_origins", "chain_consumers"),
    "cluster": ("role_terms",),
    "data": (
        "idx_balances",
        "idx_blocks",
        "idx_contracts",
        "idx_cursors",
        "idx_nft_holdings",
        "idx_nft_owners",
        "idx_nft_tokens",
        "idx_not_erc20",
        "idx_transfers",
    ),
    "metadata": ("token_metadata", "nft_metadata", "nft_refresh_requests"),
    "wallets": (
        "wallets",
        "wallet_deployments",
        "wallet_delegations",
        "gas_policies",
        "sponsorships",
    ),
    "webhooks": (
        "webhooks",
        "webhook_cursors",
        "webhook_events",
        "webhook_attempts",
        "webhook_quota",
    ),
    "bundler": ("bundler_ops", "bundler_receipts", "bundler_reputation", "bundler_intents"),
    "dashboard": (
        "dashboard_credentials",
        "dashboard_sessions",
        "dashboard_signin_links",
        "dashboard_flashes",
        "latency_rollups",
    ),
}
OWNER_OF = {table: package for package, tables in OWNERS.items() for table in tables}
# Migrations that made tables of two subsystems, or seeded a table from another's rows once:
# kept whole (a database records each migration by version and name), in the first owner's
# folder.
SHARED_MIGRATIONS = {
    # auth's rollups, filled from its minutes.
    "0012_dashboard_and_usage_rollups.sql": {"usage_hours", "usage_days", "usage_minutes"},
    "0016_role_terms_and_bundle_intents.sql": {"bundler_intents"},
    "0019_idx_not_erc20.sql": {"token_metadata"},  # the verdicts metadata had stored
}

_STATEMENT = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|COPY)\b")
_NAMED = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE(?: IF (?:NOT )?EXISTS)?|COPY)\s+([a-z_]\w*)")


def sql_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the string literals in ``path`` that hold a SQL statement keyword."""
    found = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    for token in tokens:
        if token.type == tokenize.STRING and _STATEMENT.search(token.string):
            found.append((token.start[0], token.string))
    return found


def foreign_tables() -> list[str]:
    """``path:line: table (owner)`` for every table named outside the package owning it."""
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        package = path.relative_to(SRC).parts[0]
        for line, text in sql_strings(path):
            for table in _NAMED.findall(text):
                owner = OWNER_OF.get(table)
                if owner is not None and owner != package:
                    wrong.append(f"{path.relative_to(SRC)}:{line}: {table} ({owner}'s)")
    return wrong


def test_every_table_is_named_only_by_its_owner() -> None:
    assert foreign_tables() == []


def migrations() -> list[Path]:
    return sorted(SRC.glob("*/migrations/*.sql"))


def test_every_migration_lives_beside_its_tables_owner() -> None:
    wrong = []
    for path in migrations():
        package = path.relative_to(SRC).parts[0]
        named = set(_NAMED.findall(path.read_text(encoding="utf-8")))
        named -= SHARED_MIGRATIONS.get(path.name, set())
        wrong += [
            f"{path.relative_to(SRC)}: {table} ({OWNER_OF[table]}'s)"
            for table in sorted(named)
            if OWNER_OF.get(table, package) != package
        ]
    assert wrong == []


def test_every_created_table_has_an_owner() -> None:
    """A new table needs an owner here (the tests above would not see it otherwise)."""
    created = set()
    for migration in migrations():
        created.update(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", migration.read_text()))
    renamed_away = {name for name in created if name.endswith("_by_network")}
    assert created - renamed_away <= set(OWNER_OF), sorted(created - renamed_away - set(OWNER_OF))


def test_the_check_sees_a_foreign_query(tmp_path: Path) -> None:
    """The scanner finds a table in a statement, joined or not, and ignores prose."""
    module = tmp_path / "m.py"
    module.write_text(
        'SQL = "SELECT a.email FROM webhooks w JOIN accounts a ON a.id = w.account_id"\n'
        'PROSE = "the accounts from webhooks"\n'
    )
    assert [_NAMED.findall(text) for _, text in sql_strings(module)] == [["webhooks", "accounts"]]


def test_the_engine_loads_every_packages_migrations_in_one_order() -> None:
    """Every file of every package's folder, by its global version; names as recorded."""
    loaded = load_migrations()
    assert [m.version for m in loaded] == list(range(1, len(migrations()) + 1))
    assert sorted(f"{m.version:04d}_{m.name}.sql" for m in loaded) == sorted(
        path.name for path in migrations()
    )
