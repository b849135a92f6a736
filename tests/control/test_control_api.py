"""`serve`'s control API and its episode routing, over real HTTP on loopback: episodes named by API keys,
refusals in each dialect's error shape that write nothing, and (without a control token) the header and
path routes refusing finished, foreign and malformed episodes."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from serving import ServeThread, Stub

from polarproxy.store import keys, maintenance
from polarproxy.store.errors import NotFoundError
from polarproxy.store.records import EpisodeStart
from polarproxy.store.store import Store
from polarproxy.store.writer import StoreWriter

TOKEN = "test-control-token-5d1e"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "tiny", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


@pytest.fixture
def stub(tiny_model_dir):
    s = Stub(tiny_model_dir)
    yield s
    s.stop()


@pytest.fixture
def serving(stub, tiny_model_dir, tmp_path):
    started: list[ServeThread] = []

    def start(token: str | None = None, db: str = "s.db") -> ServeThread:
        s = ServeThread(stub.url, tiny_model_dir, tmp_path / db, token=token)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def counts(db) -> tuple[int, int]:
    """(episodes, calls) in the store."""
    with Store.open(db) as store:
        eps = store.list_episodes(limit=None)
        return len(eps), sum(e.calls for e in eps)


def test_with_a_control_token_calls_need_a_live_episodes_key_and_refusals_write_nothing(serving, tmp_path):
    s = serving(token=TOKEN)
    db = tmp_path / "s.db"
    ctl = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=s.url, timeout=30) as h:
        health = h.get("/health")  # no token needed
        assert health.status_code == 200
        assert health.json()["status"] == "ok" and health.json()["default_episode"] == s.default_episode
        assert h.post("/polarproxy/v1/episodes", json={}).status_code == 401  # no token
        wrong = {"authorization": "Bearer not-the-token"}
        assert h.post("/polarproxy/v1/episodes", json={}, headers=wrong).status_code == 401
        assert h.get("/polarproxy/v1/episodes", headers=wrong).status_code == 401
        assert h.get("/polarproxy/v1/trajectories").status_code == 401
        before = counts(db)

        no_key = h.post("/v1/chat/completions", json=CHAT)
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
        made_up = h.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer ppk_madeup"})
        assert made_up.status_code == 401
        placeholder = h.post("/v1/messages", json=MESSAGES, headers={"x-api-key": "sk-polarproxy-local"})
        assert placeholder.status_code == 401 and placeholder.json()["type"] == "error"  # Anthropic's shape
        # the header naming an episode does not stand in for a key
        header_only = h.post(
            "/v1/chat/completions", json=CHAT, headers={"x-polarproxy-episode": s.default_episode}
        )
        assert header_only.status_code == 401
        assert counts(db) == before

        created = h.post(
            "/polarproxy/v1/episodes",
            json={"task": "t1", "group": "g1", "harness": "test", "metadata": {"seed": "3"}},
            headers=ctl,
        )
        assert created.status_code == 201
        ep = created.json()
        key, eid = ep["api_key"], ep["episode_id"]
        assert key != eid and eid not in key
        assert ep["base_urls"] == {"openai": f"{s.url}/v1", "anthropic": s.url, "gemini": s.url}

        # each SDK's way of sending its key; a header naming another episode does not move the call
        ok = [
            h.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {key}", "x-polarproxy-episode": s.default_episode},
            ),
            h.post("/v1/messages", json=MESSAGES, headers={"x-api-key": key}),
            h.post("/v1beta/models/tiny:generateContent", json=GEMINI, headers={"x-goog-api-key": key}),
            h.post(f"/v1beta/models/tiny:generateContent?key={key}", json=GEMINI),
        ]
        assert [r.status_code for r in ok] == [200, 200, 200, 200], [r.text for r in ok]

        listed = h.get("/polarproxy/v1/episodes", params={"task": "t1", "status": "running"}, headers=ctl)
        assert [e["id"] for e in listed.json()["episodes"]] == [eid]
        assert listed.json()["episodes"][0]["calls"] == 4

        # an episode key makes model calls only: neither its own key nor another's sets a reward or an end
        own = {"authorization": f"Bearer {key}"}
        forged = h.post(f"/polarproxy/v1/episodes/{eid}/reward", json={"reward": 1.0}, headers=own)
        assert forged.status_code == 403 and "control token" in forged.json()["error"]
        ended = h.post(f"/polarproxy/v1/episodes/{eid}/finish", json={"exit_code": 0}, headers=own)
        assert ended.status_code == 403
        other = h.post("/polarproxy/v1/episodes", json={}, headers=ctl).json()
        foreign = {"authorization": f"Bearer {other['api_key']}"}
        assert (
            h.post(f"/polarproxy/v1/episodes/{eid}/reward", json={"reward": 1.0}, headers=foreign).status_code
            == 403
        )
        assert h.get("/polarproxy/v1/trajectories", headers=own).status_code == 403

        fin = h.post(
            f"/polarproxy/v1/episodes/{eid}/finish", json={"exit_code": 0, "reward": 1.0}, headers=ctl
        )
        assert fin.status_code == 200 and fin.json()["status"] == "ok"
        again = h.post(f"/polarproxy/v1/episodes/{eid}/finish", json={"exit_code": 0}, headers=ctl)
        assert again.status_code == 409
        before = counts(db)
        late = h.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
        assert late.status_code == 409 and late.json()["error"]["code"] == "episode_finished"
        late_anthropic = h.post("/v1/messages", json=MESSAGES, headers={"x-api-key": key})
        assert late_anthropic.status_code == 409 and late_anthropic.json()["type"] == "error"
        late_reward = h.post(f"/polarproxy/v1/episodes/{eid}/reward", json={"reward": 1.0}, headers=own)
        assert late_reward.status_code == 409  # a finished episode's key is refused on every route
        assert counts(db) == before

    with Store.open(db) as store:
        episode = store.get_episode(eid)
        assert (episode.status, episode.reward, episode.task, episode.group_id) == ("ok", 1.0, "t1", "g1")
        assert [c.dialect for c in store.list_calls(eid)] == ["openai_chat", "anthropic", "gemini", "gemini"]
        with pytest.raises(NotFoundError):  # refused calls wrote nothing: not even the default episode
            store.get_episode(s.default_episode)
    stored = b"".join(f.read_bytes() for f in tmp_path.glob("s.db*"))  # the database and its WAL
    assert eid.encode() in stored
    assert key.encode() not in stored  # only its hash is stored (T5)
    with Store.open(db) as store:  # a keyed episode deletes like any other: its key and its finish with it
        assert maintenance.delete_episodes(store, [eid]) == 4
        assert keys.lookup(store, key) is None


def test_the_default_episode_is_made_by_its_first_call_and_a_serve_nobody_called_leaves_none(
    serving, tmp_path
):
    idle = serving(db="idle.db")
    idle.stop()
    assert counts(tmp_path / "idle.db") == (0, 0)
    s = serving()
    with httpx.Client(timeout=30) as h:
        assert h.post(f"{s.url}/v1/chat/completions", json=CHAT).status_code == 200
        assert h.post(f"{s.url}/v1/chat/completions", json=CHAT).status_code == 200
    s.stop()
    with Store.open(tmp_path / "s.db") as store:
        (episode,) = store.list_episodes(limit=None)
    assert (episode.id, episode.command, episode.calls, episode.status) == (
        s.default_episode,
        ["serve"],
        2,
        "ok",
    )
    assert episode.cwd == os.getcwd()  # made with serve's own start (its folder), not a named episode's


def test_without_a_token_the_header_route_refuses_bad_finished_and_foreign_episodes(serving, tmp_path):
    a = serving()
    db = tmp_path / "s.db"
    # another live recorder on the same database (a StoreWriter of this process: its pid runs) records one
    other = StoreWriter(Store.open(db))
    foreign = asyncio.run(other.create_episode(EpisodeStart(command=["other"])))
    with httpx.Client(timeout=30) as h:
        done = h.post(f"{a.url}/polarproxy/v1/episodes", json={}).json()["episode_id"]
        assert (
            h.post(f"{a.url}/polarproxy/v1/episodes/{done}/finish", json={"exit_code": 1}).status_code == 200
        )
        before = counts(db)
        for bad in ("my ep", "a/b", "x" * 200):
            r = h.post(f"{a.url}/v1/chat/completions", json=CHAT, headers={"x-polarproxy-episode": bad})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_episode", bad
        finished = h.post(f"{a.url}/v1/chat/completions", json=CHAT, headers={"x-polarproxy-episode": done})
        assert finished.status_code == 409
        by_path = h.post(f"{a.url}/e/{done}/v1/messages", json=MESSAGES)
        assert by_path.status_code == 409 and by_path.json()["type"] == "error"
        owned = h.post(f"{a.url}/v1/chat/completions", json=CHAT, headers={"x-polarproxy-episode": foreign})
        assert owned.status_code == 403 and owned.json()["error"]["code"] == "episode_owned"
        assert counts(db) == before
        # what stays: a new episode named by the header (and by a path), the default episode
        assert (
            h.post(
                f"{a.url}/v1/chat/completions", json=CHAT, headers={"x-polarproxy-episode": "run-1"}
            ).status_code
            == 200
        )
        assert h.post(f"{a.url}/e/run-1/v1/chat/completions", json=CHAT).status_code == 200
        assert h.post(f"{a.url}/v1/chat/completions", json=CHAT).status_code == 200
    other.close()  # its recorder gone, the episode is free: the header may name it again
    with httpx.Client(timeout=30) as h:
        freed = h.post(f"{a.url}/v1/chat/completions", json=CHAT, headers={"x-polarproxy-episode": foreign})
        assert freed.status_code == 409  # closing ended it (ok): finished
    with Store.open(db) as store:
        assert len(store.list_calls("run-1")) == 2
        assert store.list_calls(foreign) == []
        assert len(store.list_calls(a.default_episode)) == 1
        assert store.list_calls(done) == []


def test_trajectory_stream_parameters_are_checked(serving):
    s = serving()
    with httpx.Client(base_url=s.url, timeout=30) as h:
        for params, word in (
            ({"strategy": "both"}, "strategy"),
            ({"cursor": "nonsense!"}, "cursor"),
            ({"advantages": "grpo"}, "groups=complete"),
            ({"wait": "-1"}, "wait"),
            ({"colour": "red"}, "Unknown parameters"),
        ):
            r = h.get("/polarproxy/v1/trajectories", params=params)
            assert r.status_code == 400 and word in r.json()["error"], (params, r.text)
        empty = h.get("/polarproxy/v1/trajectories", params={"wait": "0"})
        assert empty.status_code == 200 and empty.json()["trajectories"] == []


def test_without_a_token_a_web_page_elsewhere_cannot_drive_serve(serving, tmp_path):
    """DNS rebinding (a Host that is not loopback) and cross-site simple POSTs (no JSON content type) are
    refused before anything is routed or written, and counted in /health's `refused`."""
    s = serving()
    db = tmp_path / "s.db"
    before = counts(db)
    with httpx.Client(base_url=s.url, timeout=30) as h:
        rebound = h.post("/v1/chat/completions", json=CHAT, headers={"host": "attacker.example:80"})
        assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "bad_host"
        form = h.post("/v1/chat/completions", content=b"x=1", headers={"content-type": "text/plain"})
        assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
        curl = h.post(  # `curl -d` sends a form's content type
            f"/polarproxy/v1/episodes/{s.default_episode}/reward",
            content=b'{"reward": 1.0}',
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert curl.status_code == 415
        finish = h.post(
            f"/polarproxy/v1/episodes/{s.default_episode}/finish",
            json={"exit_code": 0},
            headers={"host": "rebind.example"},
        )
        assert finish.status_code == 400
        assert h.post("/v1/chat/completions", json=CHAT).status_code == 200  # the harness's own call
        health = h.get("/health").json()
    assert health["refused"] == {"bad_host": 2, "unsupported_media_type": 2}
    # the refusals wrote nothing; the harness's own call made the default episode (made by its first call)
    assert counts(db) == (before[0] + 1, before[1] + 1)


def test_serve_beyond_loopback_needs_a_control_token(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "polarproxy", "serve", "--backend", "http://127.0.0.1:9", "--model",
         str(tiny_model_dir), "--db", str(tmp_path / "x.db"), "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--control-token" in r.stderr and "Traceback" not in r.stderr


def test_each_episode_carries_its_own_sampling_to_every_proxy_on_the_database(serving, tmp_path):
    """`sampling` of POST /polarproxy/v1/episodes: the episode's values stand in for the gateway's flags
    (here none) on every call, on this proxy and on another one sharing the database; a bad value is a
    400 that names it and creates nothing."""
    a = serving(token=TOKEN)
    ctl = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=a.url, timeout=30) as h:
        for bad, named in [
            ({"temperature": -1}, "temperature -1 must be >= 0"),
            ({"top_p": 0}, "top_p 0 must be in"),
            ({"top_k": 1.5}, "'sampling.top_k' must be an integer"),
            ({"policy": "mine"}, "'sampling.policy' 'mine' is not one of harness, override"),
            ({"temp": 1}, "Unknown 'sampling' keys ['temp']"),
            ("hot", "'sampling' must be a JSON object"),
        ]:
            r = h.post("/polarproxy/v1/episodes", json={"sampling": bad}, headers=ctl)
            assert r.status_code == 400 and named in r.text, (bad, r.text)
        sampled = {"temperature": 0.6, "top_p": 0.9, "policy": "override"}
        one = h.post("/polarproxy/v1/episodes", json={"sampling": sampled}, headers=ctl).json()
        plain = h.post("/polarproxy/v1/episodes", json={}, headers=ctl).json()
        auth = {"authorization": f"Bearer {one['api_key']}"}
        assert h.post("/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
        asks = {
            **CHAT,
            "temperature": 0.2,
            "top_k": 5,
        }  # override: the episode's values win; top_k is the harness's
        assert h.post("/v1/chat/completions", json=asks, headers=auth).status_code == 200
        plain_auth = {"authorization": f"Bearer {plain['api_key']}"}
        assert h.post("/v1/chat/completions", json=CHAT, headers=plain_auth).status_code == 200
    a.stop()  # (one mitmproxy per process: the other proxy on the database starts after this one)
    b = serving(token=TOKEN)
    with httpx.Client(base_url=b.url, timeout=30) as h:  # another proxy reads it from the episode
        assert h.post("/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
    with Store.open(tmp_path / "s.db") as store:
        calls = store.list_calls(one["episode_id"])
        sent = [c.conversation["sent_sampling"] for c in calls]
        assert [c.temperature for c in calls] == [0.6, 0.6, 0.6]
        assert [(s["top_p"], s["top_k"]) for s in sent] == [(0.9, -1), (0.9, 5), (0.9, -1)]
        assert [s["chosen_by"]["temperature"] for s in sent] == ["episode"] * 3
        assert sent[1]["chosen_by"]["top_k"] == "harness"
        (other,) = store.list_calls(plain["episode_id"])
        assert (
            other.temperature == 1.0
            and other.conversation["sent_sampling"]["chosen_by"]["temperature"] == "default"
        )
        assert store.get_episode(one["episode_id"]).metadata["sampling"] == sampled
        assert len(store.list_episodes(limit=None)) == 2  # these two: no call made a default episode


def test_finish_stores_the_verifiers_note_diff_and_tests_with_the_reward(serving, tmp_path):
    """What `rollout --serve` sends at an episode's end besides the reward (client.Graded) and its stage
    times."""
    from polarproxy.client import Client, Graded

    s = serving(token=TOKEN)
    grading = {"resolved": True, "parser": "pytest -rA", "tests": {"t::a": "PASSED"}}
    with Client(s.url, TOKEN) as client:
        eid = client.create_episode(task="t").episode_id
        graded = Graded(note="exit code 0", patch="diff --git a/x b/x\n", grading=grading)
        client.finish_episode(
            eid, exit_code=0, reward=1.0, graded=graded, stages={"execute": 2.5, "evaluate": 1}
        )
        other = client.create_episode(task="t").episode_id
    with httpx.Client(base_url=s.url, timeout=30, headers={"authorization": f"Bearer {TOKEN}"}) as h:
        bad = h.post(
            f"/polarproxy/v1/episodes/{other}/finish", json={"reward": 1.0, "grading": {"tests": [1]}}
        )
        assert bad.status_code == 400 and "'grading' must be an object" in bad.json()["error"]
        bad = h.post(f"/polarproxy/v1/episodes/{other}/finish", json={"reward": 1.0, "patch": 7})
        assert bad.status_code == 400 and "'patch' must be a string, got int" in bad.json()["error"]
        bad = h.post(f"/polarproxy/v1/episodes/{other}/finish", json={"exit_code": 0, "patch": "x"})
        assert bad.status_code == 400 and "stored with the reward: give 'reward' too" in bad.json()["error"]
        bad = h.post(f"/polarproxy/v1/episodes/{other}/finish", json={"stages": {"execute": -1}})
        assert (
            bad.status_code == 400
            and "'stages': Stage 'execute': -1 is not a number of seconds" in bad.json()["error"]
        )
    with Store.open(tmp_path / "s.db") as store:
        (r,) = store.list_rewards(eid)
        assert (r.reward, r.origin.source, r.origin.note) == (1.0, "http", "exit code 0")
        assert (r.origin.patch, r.origin.grading) == ("diff --git a/x b/x\n", grading)
        assert store.list_rewards(other) == []  # refused: nothing stored
        assert store.get_episode(eid).stages == {"execute": 2.5, "evaluate": 1.0}
        assert store.get_episode(other).status == "running"
