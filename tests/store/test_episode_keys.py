"""store/keys.py on both backends: API keys found by their hash only, finishes in order, hand-over."""

from __future__ import annotations

from polarproxy.store import keys, owners
from polarproxy.store.records import EpisodeStart


def test_keys_name_episodes_finishes_keep_their_order_and_detach_keeps_unfinished_episodes_running(store):
    a = store.create_episode(EpisodeStart(command=["serve"]))
    b = store.create_episode(EpisodeStart(command=["serve"]))
    ka, kb = keys.new_key(), keys.new_key()
    keys.add_key(store, a, ka)
    keys.add_key(store, b, kb)
    assert ka != kb and ka.startswith(keys.KEY_PREFIX)
    assert keys.lookup(store, ka).episode_id == a
    assert keys.lookup(store, keys.new_key()) is None
    for eid in (a, b):  # recorded by one proxy's writer
        owners.claim(store, eid, "w_test")
    store.finish_episode(b, status="ok")
    sb = keys.record_finish(store, b)
    assert keys.lookup(store, kb).finished and not keys.lookup(store, ka).finished
    assert keys.finishes_after(store, 0, limit=10) == [(sb, b)]
    assert keys.finishes_after(store, sb, limit=10) == []
    assert keys.detach(store, "w_test") == 1  # a only: b is finished
    assert keys.episode_state(store, a) == ("running", None)
    store.finish_episode(a, status="ok")
    sa = keys.record_finish(store, a)
    assert sa > sb and keys.last_finish(store, [a, b]) == sa
    assert keys.finishes_after(store, sb, limit=10) == [(sa, a)]
