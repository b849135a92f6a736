"""`polarproxy rm EPISODE...` and `polarproxy prune --before DATE`: whole episodes, after a confirmation or
with --yes; the episodes left are intact, including calls stored as references to earlier calls."""

from __future__ import annotations

import json
import time

from polarproxy.store import schema


def _ids(store) -> set[str]:
    return {e.id for e in store.list_episodes(limit=None)}


def _age(store, episode_id: str, days: float) -> None:
    with store._write() as conn:
        conn.execute(
            schema.episodes.update()
            .where(schema.episodes.c.id == episode_id)
            .values(started_at=time.time() - days * 86400)
        )


def test_rm_asks_first_and_deletes_nothing_on_no(cli, store, db, make_episode):
    ep, _ = make_episode(store)
    r = cli("rm", ep, "--db", db, input="n\n")
    assert r.exit_code == 1 and "Nothing deleted" in r.stderr
    assert f"Delete 1 episode(s) ({ep}) with 3 call(s)?" in r.stdout
    assert _ids(store) == {ep}


def test_rm_deletes_whole_episodes_on_yes_and_leaves_the_others_readable(cli, store, db, make_episode):
    gone, _ = make_episode(store, turns=4)
    kept, kept_calls = make_episode(store, turns=4)
    before = [(c.prompt_ids, c.output_ids) for c in store.list_calls(kept)]
    assert all(c.prompt_base_call_id for c in store.list_calls(gone)[1:])  # stored as references
    r = cli("rm", gone.removeprefix("ep_"), "--db", db, input="y\n")  # `ep_` may be left off
    assert r.exit_code == 0, r.stderr
    assert "deleted 1 episode(s) with 4 call(s)" in r.stdout
    assert _ids(store) == {kept}
    assert [(c.prompt_ids, c.output_ids) for c in store.list_calls(kept)] == before
    assert [c.id for c in store.list_calls(kept)] == kept_calls
    with store._read() as conn:
        assert conn.execute(schema.calls.select().where(schema.calls.c.episode_id == gone)).first() is None


def test_rm_with_yes_and_json(cli, store, db, make_episode):
    a, _ = make_episode(store, turns=2)
    b, _ = make_episode(store, turns=3)
    r = cli("rm", a, b, "--yes", "--json", "--db", db)
    assert r.exit_code == 0
    assert json.loads(r.stdout) == {"deleted_episodes": [a, b], "deleted_calls": 5}
    assert _ids(store) == set()


def test_rm_refuses_a_running_episode_unless_forced(cli, store, db, make_episode):
    ep, _ = make_episode(store, end=None)
    r = cli("rm", ep, "--yes", "--db", db)
    assert r.exit_code == 1 and f"Episode {ep} is still running" in r.stderr and "--force" in r.stderr
    assert _ids(store) == {ep}
    assert cli("rm", ep, "--yes", "--force", "--db", db).exit_code == 0
    assert _ids(store) == set()


def test_rm_unknown_episode_names_it(cli, store, db):
    r = cli("rm", "ep_nope", "--yes", "--db", db)
    assert r.exit_code == 1 and "ep_nope" in r.stderr and "polarproxy ls" in r.stderr


def test_prune_deletes_episodes_started_before_the_date_and_keeps_running_ones(cli, store, db, make_episode):
    old, _ = make_episode(store, turns=2)
    old_running, _ = make_episode(store, turns=1, end=None)
    new, _ = make_episode(store, turns=2)
    _age(store, old, 40)
    _age(store, old_running, 40)
    _age(store, new, 5)
    r = cli("prune", "--before", "30d", "--yes", "--json", "--db", db)
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["deleted_episodes"] == [old] and out["deleted_calls"] == 2
    assert out["kept_running"] == [old_running]
    assert _ids(store) == {old_running, new}


def test_prune_with_an_iso_date_asks_first(cli, store, db, make_episode):
    old, _ = make_episode(store, turns=1)
    _age(store, old, 400)
    cutoff = time.strftime("%Y-%m-%d", time.localtime(time.time() - 300 * 86400))
    r = cli("prune", "--before", cutoff, "--db", db, input="y\n")
    assert r.exit_code == 0 and "deleted 1 episode(s) with 1 call(s)" in r.stdout
    r = cli("prune", "--before", cutoff, "--db", db)
    assert r.exit_code == 0 and "nothing to delete" in r.stdout


def test_prune_bad_date_names_the_forms_it_takes(cli, db_path):
    r = cli("prune", "--before", "last tuesday", "--yes", "--db", str(db_path))
    assert r.exit_code == 2
    assert "Bad time 'last tuesday'" in r.stderr and "30d" in r.stderr


def test_prune_refuses_a_bare_m_and_deletes_nothing(cli, db_path):
    r = cli("prune", "--before", "1m", "--yes", "--db", str(db_path))
    assert r.exit_code == 2 and "minutes or months" in r.stderr


def test_prune_dry_run_lists_what_it_would_delete_and_deletes_nothing(cli, store, db, make_episode):
    old, _ = make_episode(store, turns=2)
    new, _ = make_episode(store, turns=2)
    _age(store, old, days=3)
    r = cli("prune", "--before", "2d", "--dry-run", "--db", db)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] == old and "would delete 1 episode(s) with 2 call(s)" in r.stdout
    assert _ids(store) == {old, new}
    r = cli("prune", "--before", "2d", "--yes", "--db", db)
    assert r.exit_code == 0 and f"deleting {old}" in r.stderr and _ids(store) == {new}
