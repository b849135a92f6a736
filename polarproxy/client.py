"""Python client of `polarproxy serve`'s control API (control/api.py): episodes and the trajectory stream.

    from polarproxy.client import Client

    with Client("http://127.0.0.1:8000", token="SECRET") as pp:
        ep = pp.create_episode(task="fix-bug-17", group="g1")
        # run a harness with ep.base_urls["openai"] and ep.api_key as its base URL and key ...
        pp.finish_episode(ep.episode_id, exit_code=0, reward=1.0)
        for row in pp.trajectories(strategy="prefix-merge", wait=30):  # export rows, each once
            ...

`AsyncClient` is the same with `async` methods and an async iterator. Errors of the API raise
`ControlError` with its status and message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

WAIT_S = 30.0  # how long one long poll of the trajectory stream waits on the server


class ControlError(Exception):
    """The control API refused a request: its HTTP status and the message it answered."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class EpisodeHandle:
    """A created episode: its ID, the API key its harness sends, and the base URL per SDK family (openai
    ends in /v1, anthropic, gemini)."""

    episode_id: str
    api_key: str = field(repr=False)  # a secret: not shown in reprs or logs
    base_urls: dict[str, str] = field(default_factory=dict)

    @property
    def proxy_url(self) -> str:
        """The gateway's URL, no /v1 (what a harness preset's {proxy_url} is)."""
        return self.base_urls["anthropic"]

    def env(self) -> dict[str, str]:
        """Environment variables that point every provider SDK at the proxy with this episode's key (the
        variables `record` sets for its child, harness/env.py, with the episode's own key)."""
        from polarproxy.harness.env import sdk_env

        return sdk_env(self.base_urls, self.api_key, self.episode_id)


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _check(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            message = r.json().get("error", r.text)
        except ValueError:
            message = r.text
        raise ControlError(r.status_code, str(message))
    return r.json()


def _episode_body(
    task: str | None,
    group: str | None,
    harness: str | None,
    metadata: dict[str, Any] | None,
    command: list[str] | None = None,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"task": task, "group": group, "harness": harness}
    if metadata:
        body["metadata"] = metadata
    if command:
        body["command"] = command
    if sampling:
        body["sampling"] = sampling
    return body


def _finish_body(
    exit_code: int | None, reward: float | None, graded: Graded | None, stages: dict[str, float] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"exit_code": exit_code, "reward": reward}
    if graded is not None:
        body.update({k: v for k, v in asdict(graded).items() if v is not None})
    if stages:
        body["stages"] = stages
    return body


@dataclass(frozen=True)
class Graded:
    """What a verifier said besides the reward, stored with it by `finish_episode`: its note, the agent's
    changes as a diff, and its per-test results (`{"tests": {ID: status}, "resolved", "parser"}`)."""

    note: str | None = None
    patch: str | None = None
    grading: dict[str, Any] | None = None


def _reward_body(reward: float, call: int | None) -> dict[str, Any]:
    return {"reward": reward} if call is None else {"reward": reward, "call": call}


def _list_params(
    status: str | None, task: str | None, group: str | None, limit: int | None
) -> dict[str, Any]:
    params = {"status": status, "task": task, "group": group, "limit": limit}
    return {k: v for k, v in params.items() if v is not None}


def _traj_params(
    strategy: str,
    cursor: str | None,
    wait: float,
    groups: str | None,
    advantages: str | None,
    limit: int | None,
    std_estimator: str | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {"strategy": strategy, "wait": wait}
    given = {"cursor": cursor, "groups": groups, "advantages": advantages, "std_estimator": std_estimator}
    for k, v in (*given.items(), ("limit", limit)):
        if v is not None:
            params[k] = v
    return params


def _handle(data: dict[str, Any]) -> EpisodeHandle:
    return EpisodeHandle(episode_id=data["episode_id"], api_key=data["api_key"], base_urls=data["base_urls"])


class Client:
    """The control API of one `serve` proxy at `url` (`token`: its --control-token, if it has one)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.cursor: str | None = None  # where `trajectories` left off
        self.excluded_failed = 0  # episodes the stream's answers left out of their groups as `infra` failures
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.url, headers=_headers(token), timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        return _check(self._http.get("/health"))  # type: ignore[no-any-return]

    def create_episode(
        self,
        *,
        task: str | None = None,
        group: str | None = None,
        harness: str | None = None,
        metadata: dict[str, Any] | None = None,
        command: list[str] | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> EpisodeHandle:
        """A new episode; `command`: the harness's command line, shown by `ls` (secrets redacted);
        `sampling`: its own `temperature`, `top_p`, `top_k` and `policy`, over the gateway's flags."""
        body = _episode_body(task, group, harness, metadata, command, sampling)
        return _handle(_check(self._http.post("/polarproxy/v1/episodes", json=body)))

    def reward(self, episode_id: str, reward: float, *, call: int | None = None) -> dict[str, Any]:
        """Set the episode's reward, or with `call` (its sequence number) that call's."""
        path = f"/polarproxy/v1/episodes/{episode_id}/reward"
        return _check(self._http.post(path, json=_reward_body(reward, call)))  # type: ignore[no-any-return]

    def finish_episode(
        self,
        episode_id: str,
        *,
        exit_code: int | None = 0,
        reward: float | None = None,
        graded: Graded | None = None,
        stages: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """End the episode (status ok for exit code 0 or None, else failed), with its reward if given."""
        path = f"/polarproxy/v1/episodes/{episode_id}/finish"
        return _check(self._http.post(path, json=_finish_body(exit_code, reward, graded, stages)))  # type: ignore[no-any-return]

    def episodes(
        self,
        *,
        status: str | None = None,
        task: str | None = None,
        group: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        data = _check(
            self._http.get("/polarproxy/v1/episodes", params=_list_params(status, task, group, limit))
        )
        return data["episodes"]  # type: ignore[no-any-return]

    def pull(
        self,
        *,
        strategy: str = "per-request",
        cursor: str | None = None,
        wait: float = 0.0,
        groups: str | None = None,
        advantages: str | None = None,
        limit: int | None = None,
        std_estimator: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """One answer of the trajectory stream: (rows, the cursor to pass next). `std_estimator`: GRPO's
        std, sample (the gateway's default) or population."""
        params = _traj_params(strategy, cursor, wait, groups, advantages, limit, std_estimator)
        data = _check(
            self._http.get("/polarproxy/v1/trajectories", params=params, timeout=self._timeout + wait)
        )
        self.excluded_failed += int(data.get("excluded_failed", 0))
        return data["trajectories"], data["cursor"]

    def trajectories(
        self,
        *,
        strategy: str = "per-request",
        cursor: str | None = None,
        wait: float = WAIT_S,
        groups: str | None = None,
        advantages: str | None = None,
        stop_when_idle: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Export rows of finished episodes, each once, as they finish (long polls of `wait` seconds).
        Starts at `cursor` (default: where this client left off, else the first finished episode); runs
        until the caller stops, or with `stop_when_idle` after a poll that brought nothing. `self.cursor`
        is where it stands."""
        self.cursor = cursor if cursor is not None else self.cursor
        while True:
            rows, self.cursor = self.pull(
                strategy=strategy, cursor=self.cursor, wait=wait, groups=groups, advantages=advantages
            )
            yield from rows
            if not rows and stop_when_idle:
                return


class AsyncClient:
    """`Client` for asyncio: the same methods, awaited; `trajectories` is an async iterator."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.cursor: str | None = None
        self.excluded_failed = 0
        self._timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.url, headers=_headers(token), timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def health(self) -> dict[str, Any]:
        return _check(await self._http.get("/health"))  # type: ignore[no-any-return]

    async def create_episode(
        self,
        *,
        task: str | None = None,
        group: str | None = None,
        harness: str | None = None,
        metadata: dict[str, Any] | None = None,
        command: list[str] | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> EpisodeHandle:
        body = _episode_body(task, group, harness, metadata, command, sampling)
        return _handle(_check(await self._http.post("/polarproxy/v1/episodes", json=body)))

    async def reward(self, episode_id: str, reward: float, *, call: int | None = None) -> dict[str, Any]:
        path = f"/polarproxy/v1/episodes/{episode_id}/reward"
        return _check(await self._http.post(path, json=_reward_body(reward, call)))  # type: ignore[no-any-return]

    async def finish_episode(
        self,
        episode_id: str,
        *,
        exit_code: int | None = 0,
        reward: float | None = None,
        graded: Graded | None = None,
        stages: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        path = f"/polarproxy/v1/episodes/{episode_id}/finish"
        return _check(await self._http.post(path, json=_finish_body(exit_code, reward, graded, stages)))  # type: ignore[no-any-return]

    async def episodes(
        self,
        *,
        status: str | None = None,
        task: str | None = None,
        group: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        params = _list_params(status, task, group, limit)
        data = _check(await self._http.get("/polarproxy/v1/episodes", params=params))
        return data["episodes"]  # type: ignore[no-any-return]

    async def pull(
        self,
        *,
        strategy: str = "per-request",
        cursor: str | None = None,
        wait: float = 0.0,
        groups: str | None = None,
        advantages: str | None = None,
        limit: int | None = None,
        std_estimator: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        params = _traj_params(strategy, cursor, wait, groups, advantages, limit, std_estimator)
        data = _check(
            await self._http.get("/polarproxy/v1/trajectories", params=params, timeout=self._timeout + wait)
        )
        self.excluded_failed += int(data.get("excluded_failed", 0))
        return data["trajectories"], data["cursor"]

    async def trajectories(
        self,
        *,
        strategy: str = "per-request",
        cursor: str | None = None,
        wait: float = WAIT_S,
        groups: str | None = None,
        advantages: str | None = None,
        stop_when_idle: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        self.cursor = cursor if cursor is not None else self.cursor
        while True:
            rows, self.cursor = await self.pull(
                strategy=strategy, cursor=self.cursor, wait=wait, groups=groups, advantages=advantages
            )
            for row in rows:
                yield row
            if not rows and stop_when_idle:
                return
