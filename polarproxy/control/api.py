"""`serve`'s control API: episodes named by API keys, their rewards and ends, and the trajectory stream.

Routes (JSON in and out; with a control token, each needs `Authorization: Bearer TOKEN`):

    GET  /health                                   status, version, uptime, default episode (no token needed)
    POST /polarproxy/v1/episodes                   {task, group, harness, metadata, command, sampling}
                                                   -> {episode_id, api_key, base_urls}
    GET  /polarproxy/v1/episodes?status=&task=&group=&limit=
    POST /polarproxy/v1/episodes/{id}/finish       {exit_code, reward}
    POST /polarproxy/v1/episodes/{id}/reward       {reward, call} (the addon stores it; never with an episode key)
    GET  /polarproxy/v1/trajectories?strategy=per-request|prefix-merge&cursor=C&wait=S
                                     [&groups=complete&advantages=grpo|rloo|none
                                      &std_estimator=sample|population&limit=N]

An episode created here gets a fresh random API key (store/keys.py keeps only its hash). A harness call
carrying that key (`Authorization: Bearer`, `x-api-key`, `x-goog-api-key` or `?key=`, as each SDK sends it)
belongs to that episode whatever header or path it carries. With a control token set, a call without a
valid key, with the key of no episode or of a finished one is refused in its dialect's error shape (401,
409) and nothing is written. Without one (loopback use), the `x-polarproxy-episode` header and `/e/ID/` path
routes stay, but they too refuse a finished episode (409), one another live proxy records (403) and IDs
that break the ID rule (400).

Routing a call reads the database only when the episode (or key) was not confirmed in the last
`ROUTE_TTL_S` seconds (`Routes`): an episode finished through this proxy is refused at once, one finished
through another proxy on the same database within that time.

The trajectory stream answers the export rows (schemas/export-row.v3.json, built by the export code) of
the episodes finished here since the opaque cursor, in the order they were finished, long-polling up to
`wait` seconds, so a puller that passes back each answer's cursor gets each trajectory once. With
`groups=complete` only whole groups come (a group is complete when none of its episodes runs any more);
a group comes with the answer that covers its last finish, with the advantages `export --advantages`
computes (a group whose rewards are all equal is dropped, as the export drops it).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import re
import time
from collections import Counter
from dataclasses import asdict
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import orjson

from polarproxy.capture.sampling import episode_sampling
from polarproxy.choices import ESTIMATORS, GROUPS_MODES, STD_ESTIMATORS, STRATEGIES, one_of
from polarproxy.control.routes import Refusal, Routes, request_key
from polarproxy.control.stream import collect, decode_cursor, encode_cursor
from polarproxy.harness.env import base_urls
from polarproxy.loopback import is_json, loopback_host
from polarproxy.redact import redact_argv
from polarproxy.store import keys
from polarproxy.store.episodes import valid_stages
from polarproxy.store.ids import EPISODE_ID, invalid_episode_header
from polarproxy.store.query import EpisodeQuery
from polarproxy.store.records import EpisodeStart
from polarproxy.store.rewards import valid_grading

if TYPE_CHECKING:
    from mitmproxy import http

    from polarproxy.store.store import Store
    from polarproxy.store.writer import StoreWriter

log = logging.getLogger("polarproxy.control")

EPISODES_PATH = "/polarproxy/v1/episodes"
TRAJECTORIES_PATH = "/polarproxy/v1/trajectories"
HEALTH_PATH = "/health"
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
MAX_NOTE_CHARS = 4_000  # a verifier's note, as kept with a reward set through finish
_EPISODE_ACTION = re.compile(f"^/polarproxy/v1/episodes/({EPISODE_ID})/(finish|reward)/?$")
MAX_WAIT_S = 300.0
SAMPLING_METADATA = "sampling"  # the episode metadata key that holds its own sampling values
MAX_SAMPLING_CACHED = 100_000  # episodes whose sampling values a proxy keeps in memory
POLL_S = 0.25  # how often a long poll looks for episodes finished by other proxies on the same database
DEFAULT_LIMIT = 100


class Control:
    """The control API and the episode routing of one `serve` proxy."""

    def __init__(
        self,
        writer: StoreWriter,
        *,
        token: str | None = None,
        default_episode: str | None = None,
        url: str = "",
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.writer = writer
        self.token = token or None
        # stored with every episode created here, under what its creator gives (the model folder: `audit`
        # re-renders with it)
        self.metadata = dict(metadata or {})
        self.default_episode = default_episode
        self.url = url
        self.started = time.time()
        self._finished = asyncio.Event()  # set (and replaced) whenever an episode is finished here
        self.routes = Routes()
        self.refused: Counter[str] = Counter()  # refusals by reason, for /health
        # each episode's own sampling values (`sampling` of POST /polarproxy/v1/episodes), also stored in its
        # metadata for the other proxies on the database; None: the flags'
        self._sampling: dict[str, dict[str, Any] | None] = {}

    @property
    def store(self) -> Store:
        return self.writer.store

    # ---- harness calls ---------------------------------------------------------------------------------

    async def episode_for(
        self, req: http.Request, named: str | None, from_path: bool
    ) -> str | Refusal | None:
        """The episode a harness call belongs to (None: the default episode), or why it is refused (and
        counted in /health's `refused`). `named` is the episode its header or `/e/ID/` path names
        (`from_path`: the path)."""
        decided = self.open_refusal(req) or await self._route_call(req, named, from_path)
        if isinstance(decided, Refusal):
            self.refused[decided.code] += 1
        return decided

    async def sampling_for(self, episode_id: str) -> dict[str, Any] | None:
        """The episode's own sampling values (None: the flags'); for an episode created by another proxy on
        the database, read from its metadata once."""
        if episode_id in self._sampling:
            return self._sampling[episode_id]
        try:
            metadata = await asyncio.to_thread(keys.episode_metadata, self.store, episode_id)
            found = (metadata or {}).get(SAMPLING_METADATA)
        except Exception:  # the store is down: the flags'
            found = None
        sampling = found if isinstance(found, dict) else None
        self._remember_sampling(episode_id, sampling)
        return sampling

    def _remember_sampling(self, episode_id: str, sampling: dict[str, Any] | None) -> None:
        if len(self._sampling) >= MAX_SAMPLING_CACHED:  # the oldest first
            self._sampling.pop(next(iter(self._sampling)))
        self._sampling[episode_id] = sampling

    def open_refusal(self, req: http.Request) -> Refusal | None:
        """Without a control token (loopback use), what keeps a web page elsewhere out: a Host that is not a
        loopback name (DNS rebinding) is refused, and so is a write without a JSON content type (a
        cross-site simple POST)."""
        if self.token is not None:
            return None
        host = req.headers.get("host")
        if not loopback_host(host):
            return Refusal(
                400,
                f"Host {host!r} is not a loopback name: serve without --control-token answers requests to "
                "127.0.0.1, ::1 and localhost only.",
                "bad_host",
            )
        if req.method in WRITE_METHODS and not is_json(req.headers.get("content-type")):
            return Refusal(
                415,
                f"{req.method} needs Content-Type: application/json (serve without --control-token refuses "
                "other writes, which a web page elsewhere could send).",
                "unsupported_media_type",
            )
        return None

    async def _route_call(
        self, req: http.Request, named: str | None, from_path: bool
    ) -> str | Refusal | None:
        key = request_key(req)
        if key is not None and (self.token or key.startswith(keys.KEY_PREFIX)):
            routed = self.routes.keyed(key)
            if routed is not None:
                return routed
            try:
                found = await asyncio.to_thread(keys.lookup, self.store, key)
            except Exception as e:  # the store is down: fail closed, but keys known here keep working
                known = self.routes.known(key)
                return known if known is not None else _store_refusal(e)
            if found is not None:
                if found.finished:
                    return Refusal(
                        409,
                        f"Episode {found.episode_id} is finished ({found.status}); its API key takes no more "
                        "calls. Create a new episode with POST /polarproxy/v1/episodes.",
                        "episode_finished",
                    )
                self.routes.confirm(found.episode_id, key)
                return found.episode_id
        if self.token or (key is not None and key.startswith(keys.KEY_PREFIX)):
            what = "carries no API key" if key is None else "carries an API key that names no episode"
            return Refusal(
                401,
                f"This call {what}. Send the api_key that POST /polarproxy/v1/episodes answered, as the SDK's "
                "API key (Authorization: Bearer, x-api-key or x-goog-api-key).",
                "invalid_api_key",
            )
        if named is None:
            return None
        invalid = None if from_path else invalid_episode_header(named)
        if invalid is not None:
            return Refusal(400, invalid, "invalid_episode")
        if self.routes.named(named):
            return named
        try:
            state = await asyncio.to_thread(keys.episode_state, self.store, named)
        except Exception as e:  # the store is down: an episode this proxy served goes on, others wait
            return named if self.routes.was_named(named) else _store_refusal(e)
        if state is not None:
            status, writer_id = state
            if status != "running":
                return Refusal(
                    409,
                    f"Episode {named} is finished ({status}); it takes no more calls.",
                    "episode_finished",
                )
            if writer_id not in (None, self.writer.identity.id) and await asyncio.to_thread(
                keys.writer_alive, self.store, writer_id
            ):
                return Refusal(
                    403,
                    f"Episode {named} is recorded by another running proxy; send its calls there.",
                    "episode_owned",
                )
        self.routes.confirm(named)  # running here, or a new episode the harness names
        return named

    # ---- control routes --------------------------------------------------------------------------------

    async def answer(self, flow: http.HTTPFlow) -> bool:
        """Answer a control route (True), or let the addon answer it (False: the reward route, authorized)."""
        req = flow.request
        bare = req.path.partition("?")[0].rstrip("/") or "/"
        if bare == HEALTH_PATH:
            return self._health(flow, req.method)
        action = _EPISODE_ACTION.match(bare)
        opened = self.open_refusal(req)
        denied = (opened.status, opened.message) if opened is not None else await self._denied(req)
        if denied is not None:
            self.refused[opened.code if opened is not None else HTTPStatus(denied[0]).phrase] += 1
            _json(flow, denied[0], {"error": denied[1]})
            return True
        try:
            if bare == EPISODES_PATH:
                if req.method == "POST":
                    await self._create(flow)
                elif req.method == "GET":
                    await self._list(flow)
                else:
                    _method(flow, bare, "GET or POST", req.method)
                return True
            if bare == TRAJECTORIES_PATH:
                if req.method != "GET":
                    _method(flow, bare, "GET", req.method)
                else:
                    await self._trajectories(flow)
                return True
            if action is not None and action.group(2) == "finish":
                if req.method != "POST":
                    _method(flow, bare, "POST", req.method)
                else:
                    await self._finish(flow, action.group(1))
                return True
        except BadRequest as e:
            _json(flow, 400, {"error": str(e)})
            return True
        return False  # the reward route, or an unknown one: the addon answers

    async def _denied(self, req: http.Request) -> tuple[int, str] | None:
        """None when the request may use the control routes (no control token set, or it carries it); else
        the status and message. An episode's API key makes model calls and nothing else: it never sets a
        reward or a status (403), and once its episode is finished it is refused everywhere (409)."""
        if self.token is None:
            return None
        auth = req.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode()):
            return None
        key = request_key(req)
        try:
            found = None if key is None else await asyncio.to_thread(keys.lookup, self.store, key)
        except Exception as e:
            return 503, _store_refusal(e).message
        if found is not None and found.finished:
            return 409, f"Episode {found.episode_id} is finished ({found.status}); its API key is refused."
        if found is not None:
            return 403, (
                "An episode's API key makes model calls only: rewards and ends come from the verifier or "
                "from a holder of the control token (Authorization: Bearer TOKEN)."
            )
        return 401, (
            "The control API needs the control token: send Authorization: Bearer TOKEN "
            "(serve --control-token / POLARPROXY_CONTROL_TOKEN)."
        )

    def _health(self, flow: http.HTTPFlow, method: str) -> bool:
        from polarproxy import __version__

        if method not in ("GET", "HEAD"):
            _method(flow, HEALTH_PATH, "GET", method)
            return True
        _json(
            flow,
            200,
            {
                "status": "ok",
                "version": __version__,
                "uptime_s": round(time.time() - self.started, 3),
                "default_episode": self.default_episode,
                "control_token": self.token is not None,
                "refused": dict(sorted(self.refused.items())),  # requests refused, by reason
            },
        )
        return True

    async def _create(self, flow: http.HTTPFlow) -> None:
        body = _body(flow, {"task", "group", "harness", "metadata", "command", "sampling"})
        for name in ("task", "group", "harness"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise BadRequest(f"'{name}' must be a string, got {body[name]!r}.")
        command = body.get("command") or ["serve"]
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise BadRequest(
                f"'command' must be a list of strings (the harness's command line), got {command!r}."
            )
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise BadRequest(f"'metadata' must be a JSON object, got {metadata!r}.")
        try:
            sampling = episode_sampling(body.get("sampling"))
        except ValueError as e:
            raise BadRequest(str(e)) from e
        metadata = {**self.metadata, **metadata}
        if sampling is not None:
            metadata[SAMPLING_METADATA] = sampling
        episode_id = await self.writer.create_episode(
            EpisodeStart(
                command=redact_argv(command),
                harness=body.get("harness"),
                task=body.get("task"),
                group_id=body.get("group"),
                metadata=metadata,
            )
        )
        self._remember_sampling(episode_id, sampling)
        key = keys.new_key()
        try:
            await asyncio.to_thread(keys.add_key, self.store, episode_id, key)
        except Exception as e:  # the database is down: an episode without a key would take no calls
            await self.writer.finish_episode(episode_id, status="failed", exit_code=None)
            _json(flow, 503, {"error": f"The episode's key was not stored: {e}"})
            return
        self.routes.confirm(episode_id, key)  # issued here: valid from memory while the store is down
        _json(
            flow,
            201,
            {
                "episode_id": episode_id,
                "api_key": key,
                "base_urls": base_urls(self.url),
            },
        )

    async def _list(self, flow: http.HTTPFlow) -> None:
        q = flow.request.query
        unknown = sorted(set(q.keys()) - {"status", "task", "group", "limit"})
        if unknown:
            raise BadRequest(f"Unknown parameters {unknown}; allowed: status, task, group, limit.")
        try:
            where = EpisodeQuery(task=q.get("task"), group_id=q.get("group"), status=q.get("status"))
        except ValueError as e:
            raise BadRequest(str(e)) from None
        limit = _int_param(q.get("limit"), "limit", default=DEFAULT_LIMIT)
        episodes = await asyncio.to_thread(self.store.list_episodes, limit, where=where)
        _json(flow, 200, {"episodes": [asdict(e) for e in episodes]})

    async def _finish(self, flow: http.HTTPFlow, episode_id: str) -> None:
        body = _body(flow, {"exit_code", "reward", "note", "patch", "grading", "stages"})
        exit_code, reward = body.get("exit_code"), body.get("reward")
        note, patch, grading = body.get("note"), body.get("patch"), body.get("grading")
        for name, value in (("note", note), ("patch", patch)):
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"'{name}' must be a string, got {type(value).__name__}.")
        if reward is None and (note, patch, grading) != (None, None, None):
            raise BadRequest("'note', 'patch' and 'grading' are stored with the reward: give 'reward' too.")
        if note is not None and len(note) > MAX_NOTE_CHARS:
            note = note[:MAX_NOTE_CHARS] + "…"
        stages = body.get("stages")
        if stages is not None:
            if not isinstance(stages, dict):
                raise BadRequest(
                    f"'stages' must be an object {{stage: seconds}}, not {type(stages).__name__}."
                )
            try:
                stages = valid_stages(stages)
            except ValueError as e:
                raise BadRequest(f"'stages': {e}") from None
        if grading is not None and valid_grading(grading) is None:
            raise BadRequest(
                '\'grading\' must be an object {"tests": {test ID: status}, "resolved": bool, "parser": str}.'
            )
        if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
            raise BadRequest(f"'exit_code' must be an integer, got {exit_code!r}.")
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
        ):
            raise BadRequest(f"'reward' must be a finite number, got {reward!r}.")
        state = await asyncio.to_thread(keys.episode_state, self.store, episode_id)
        if state is None:
            _json(flow, 404, {"error": f"No episode {episode_id!r}. GET /polarproxy/v1/episodes lists them."})
            return
        if state[0] != "running":
            _json(flow, 409, {"error": f"Episode {episode_id} is finished already ({state[0]})."})
            return
        from polarproxy.store.records import RewardOrigin

        self.routes.drop(episode_id)  # its calls are refused from now on (read again, they find it finished)
        self._sampling.pop(episode_id, None)
        try:
            if reward is not None:
                origin = RewardOrigin(
                    source="http", note=note or "finish", patch=patch, grading=valid_grading(grading)
                )
                await self.writer.set_rewards(episode_id, episode=float(reward), origin=origin)
            status = "ok" if exit_code in (None, 0) else "failed"
            await self.writer.finish_episode(episode_id, status=status, exit_code=exit_code, stages=stages)
            seq = await asyncio.to_thread(keys.record_finish, self.store, episode_id)
        except Exception as e:
            _json(flow, 503, {"error": f"The episode's end was not stored: {e}"})
            return
        self._finished.set()
        self._finished = asyncio.Event()
        _json(
            flow,
            200,
            {
                "episode_id": episode_id,
                "status": status,
                "exit_code": exit_code,
                "reward": reward,
                "seq": seq,
            },
        )

    async def _trajectories(self, flow: http.HTTPFlow) -> None:
        q = flow.request.query
        allowed = {"strategy", "cursor", "wait", "groups", "advantages", "std_estimator", "limit"}
        unknown = sorted(set(q.keys()) - allowed)
        if unknown:
            raise BadRequest(f"Unknown parameters {unknown}; allowed: {', '.join(sorted(allowed))}.")
        strategy = q.get("strategy") or "per-request"
        if strategy not in STRATEGIES:
            raise BadRequest(
                f"Unknown strategy {strategy!r}. Must be one of {', '.join(map(repr, STRATEGIES))}."
            )
        groups = q.get("groups") or "any"
        if groups not in GROUPS_MODES:
            raise BadRequest(f"Unknown groups {groups!r}. Must be 'complete' (whole groups only) or 'any'.")
        estimator = q.get("advantages") or "none"
        if estimator not in ESTIMATORS:
            raise BadRequest(
                f"Unknown advantages {estimator!r}. Must be one of {', '.join(map(repr, ESTIMATORS))}."
            )
        if estimator != "none" and groups != "complete":
            raise BadRequest(f"advantages={estimator} needs whole groups: add groups=complete.")
        std_estimator = q.get("std_estimator") or "sample"
        if std_estimator not in STD_ESTIMATORS:
            raise BadRequest(
                f"Unknown std_estimator {std_estimator!r}. Must be one of {one_of(STD_ESTIMATORS)}."
            )
        try:
            after = decode_cursor(q.get("cursor"))
        except ValueError as e:
            raise BadRequest(str(e)) from None
        wait = _float_param(q.get("wait"), "wait", default=0.0)
        limit = _int_param(q.get("limit"), "limit", default=DEFAULT_LIMIT)
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_S)
        excluded = 0  # episodes that left their groups as `infra` failures (export/failures.py)
        while True:
            event = self._finished
            rows, after, left_out = await asyncio.to_thread(
                collect, self.store, after, strategy=strategy, whole_groups=groups == "complete",
                estimator=estimator, limit=limit, std_estimator=std_estimator,
            )  # fmt: skip
            excluded += left_out
            left = deadline - time.monotonic()
            if rows or left <= 0:
                break
            try:
                await asyncio.wait_for(event.wait(), timeout=min(left, POLL_S))
            except TimeoutError:
                pass
        answer = {"trajectories": rows, "cursor": encode_cursor(after), "excluded_failed": excluded}
        flow.response = _response(200, orjson.dumps(answer))


def _store_refusal(e: Exception) -> Refusal:
    """A call whose key cannot be checked: refused (never passed on unchecked), in its dialect's shape."""
    log.warning("refused a call whose key could not be checked: %s", e)
    return Refusal(
        503,
        "polarproxy cannot check this call's API key: its store does not answer. Nothing was forwarded; "
        "retry once the database is back.",
        "store_unavailable",
    )


class BadRequest(ValueError):
    """A control request with a bad body or parameter (400)."""


def _response(status: int, body: bytes) -> http.Response:
    from mitmproxy import http

    from polarproxy.capture.call_run import JSON_HEADERS

    return http.Response.make(status, body, JSON_HEADERS)


def _json(flow: http.HTTPFlow, status: int, body: dict[str, Any]) -> None:
    flow.response = _response(status, orjson.dumps(body))


def _method(flow: http.HTTPFlow, path: str, allowed: str, got: str) -> None:
    _json(flow, 405, {"error": f"{path} takes {allowed}, not {got}."})


def _body(flow: http.HTTPFlow, allowed: set[str]) -> dict[str, Any]:
    content = flow.request.content or b"{}"
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"The body is not valid JSON: {e}.") from None
    if not isinstance(body, dict):
        raise BadRequest(f"The body must be a JSON object, not {type(body).__name__}.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"Unknown keys {unknown}; allowed: {', '.join(map(repr, sorted(allowed)))}.")
    return body


def _int_param(value: str | None, name: str, *, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise BadRequest(f"'{name}' must be a positive integer, got {value!r}.") from None
    if n < 1:
        raise BadRequest(f"'{name}' must be a positive integer, got {value!r}.")
    return n


def _float_param(value: str | None, name: str, *, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        x = float(value)
    except ValueError:
        raise BadRequest(f"'{name}' must be a number of seconds, got {value!r}.") from None
    if not math.isfinite(x) or x < 0:
        raise BadRequest(f"'{name}' must be a number of seconds, got {value!r}.")
    return x
