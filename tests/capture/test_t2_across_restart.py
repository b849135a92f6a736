"""T2 across processes: a proxy that did not serve an episode's earlier calls extends them from the store."""

from __future__ import annotations

import httpx
from serving import ServeThread, Stub

from polarproxy.store.store import Store

FIRST = [{"role": "user", "content": "hi"}]


def test_t2_holds_across_a_serve_restart_in_the_middle_of_an_episode(tiny_model_dir, tmp_path):
    stub = Stub(tiny_model_dir)
    db = tmp_path / "s.db"
    try:
        first = ServeThread(stub.url, tiny_model_dir, db)
        with httpx.Client(timeout=30) as h:
            ep = h.post(f"{first.url}/polarproxy/v1/episodes", json={"task": "t"}).json()
            auth = {"authorization": f"Bearer {ep['api_key']}"}
            r1 = h.post(
                f"{ep['base_urls']['openai']}/chat/completions", json={"messages": FIRST}, headers=auth
            )
            assert r1.status_code == 200
            answer = r1.json()["choices"][0]["message"]["content"]
        first.stop()  # a restart: the new proxy's prefix index has never seen this episode

        second = ServeThread(stub.url, tiny_model_dir, db)
        try:
            later = [
                *FIRST,
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "and then?"},
            ]
            with httpx.Client(timeout=30) as h:
                r2 = h.post(f"{second.url}/v1/chat/completions", json={"messages": later}, headers=auth)
                assert r2.status_code == 200, r2.text
        finally:
            second.stop()
    finally:
        stub.stop()
    with Store.open(db) as store:
        # stopping a proxy does not end the episodes of the control API: the next proxy serves them on
        assert store.get_episode(ep["episode_id"]).status == "running"
        c1, c2 = store.list_calls(ep["episode_id"])
    assert c1.render_mode == "fresh"
    assert (c2.render_mode, c2.extended_from) == ("extended", c1.id), c2.render_note
    assert c2.prompt_ids[: len(c1.prompt_ids) + len(c1.output_ids)] == c1.prompt_ids + c1.output_ids
    assert len(c2.prompt_ids) > len(c1.prompt_ids) + len(c1.output_ids)
