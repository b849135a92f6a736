import sqlite3

import pytest
from sqlalchemy import inspect, text

from polarproxy.store import Store, schema
from polarproxy.store import migrations as mig


def _tables(path):
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _applied(path):
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY applied_at")]


def test_blank_database_gets_all_tables_and_records_m001(db_path):
    Store.open(db_path).close()
    assert {"_migrations", "episodes", "calls"} <= _tables(db_path)
    assert _applied(db_path) == ["m001_initial"]


def test_reopening_applies_nothing(db_path):
    Store.open(db_path).close()
    with Store.open(db_path) as store:
        assert mig.migrate(store.engine) == []
    assert _applied(db_path) == ["m001_initial"]


def test_migrations_are_named_in_order():
    names = [fn.__name__ for fn in mig.MIGRATIONS]
    assert names[0] == "m001_initial"
    assert names == sorted(names) and len(set(names)) == len(names)


def test_migrated_database_matches_the_tables_in_schema_module(store):
    insp = inspect(store.engine)
    for table in schema.metadata.sorted_tables:
        stored = {c["name"]: c for c in insp.get_columns(table.name)}
        assert list(stored) == [c.name for c in table.columns], table.name
        for col in table.columns:
            assert stored[col.name]["nullable"] == col.nullable, (table.name, col.name)
        indexes = {
            i["name"]: (tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(table.name)
        }
        assert indexes == {i.name: (tuple(c.name for c in i.columns), bool(i.unique)) for i in table.indexes}
        fks = {
            (tuple(fk["constrained_columns"]), fk["referred_table"])
            for fk in insp.get_foreign_keys(table.name)
        }
        assert fks == {((fk.parent.name,), fk.column.table.name) for fk in table.foreign_keys}


def test_upgrade_applies_only_the_new_migration_once(db_path, monkeypatch):
    Store.open(db_path).close()  # a database at m001

    def m002_add_notes(conn):
        conn.execute(text("ALTER TABLE episodes ADD COLUMN notes TEXT"))

    monkeypatch.setattr(mig, "MIGRATIONS", [*mig.MIGRATIONS, m002_add_notes])
    Store.open(db_path).close()
    Store.open(db_path).close()
    assert _applied(db_path) == ["m001_initial", "m002_add_notes"]
    with sqlite3.connect(db_path) as conn:
        assert "notes" in {r[1] for r in conn.execute("PRAGMA table_info(episodes)")}


def test_failed_migration_rolls_back_completely(db_path, monkeypatch):
    def m002_half_done(conn):
        conn.execute(text("CREATE TABLE half (x INTEGER)"))
        raise RuntimeError("boom")

    monkeypatch.setattr(mig, "MIGRATIONS", [*mig.MIGRATIONS, m002_half_done])
    with pytest.raises(RuntimeError, match="boom"):
        Store.open(db_path)
    # Nothing of the failed run stays, not even m001, which ran in the same transaction.
    assert _tables(db_path) <= {"_migrations"}
    monkeypatch.setattr(mig, "MIGRATIONS", mig.MIGRATIONS[:-1])
    Store.open(db_path).close()
    assert _applied(db_path) == ["m001_initial"] and "half" not in _tables(db_path)
