"""Where `rollout` gets its episodes: the control API (control/api.py, through polarproxy.client) of a
gateway it starts in this process (`--backend ... --db ...`, with a fresh control token), or of a running
`serve` (`--serve URL --control-token TOKEN`).

An episode is created with POST /polarproxy/v1/episodes and named by the API key it is given: the harness
sends that key, so its calls belong to that episode whatever else they carry, and with a control token a
call without a valid key is refused. An episode is finished once, after it is evaluated, so a trainer that
pulls whole groups from the trajectory stream sees it with its reward.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from polarproxy.client import EpisodeHandle, Graded
from polarproxy.errors import UsageError
from polarproxy.rewards.verifier import VerifierResult

PRIOR_LIMIT = 100_000  # episodes of one group read back for --resume


@dataclass(slots=True)
class PriorEpisode:
    """An episode of an earlier run of this rollout (for --resume)."""

    episode_id: str
    status: str
    reward: float | None
    metadata: dict[str, Any] = field(default_factory=dict)


class Episodes(Protocol):
    url: str  # http://127.0.0.1:PORT of the gateway
    port: int
    db: str | None  # where the episodes are stored (passwords hidden); None: a running serve's own store

    def create(
        self,
        *,
        task: str,
        group: str,
        harness: str | None,
        metadata: dict[str, str],
        command: list[str] | None = None,
    ) -> EpisodeHandle: ...

    def end(
        self,
        episode_id: str,
        *,
        exit_code: int,
        result: VerifierResult | None,
        stages: dict[str, float] | None = None,
    ) -> None:
        """Store the verifier's result (None: not evaluated) and finish the episode (exit 0: ok), with the
        seconds each stage took."""
        ...

    def prior(self, rollout_id: str, groups: list[str]) -> list[PriorEpisode]: ...

    def calls_made(self, episode_id: str, group: str) -> int:
        """How many model calls the episode has made (to tell a harness that never reached the model)."""
        ...

    def close(self) -> None: ...


def _control_error(url: str, e: Exception) -> UsageError:
    return UsageError(
        f"The control API at {url} refused or did not answer: {e}",
        hint="Is `polarproxy serve` running there, with this --control-token?",
    )


class ControlEpisodes:
    """Episodes through a control API at `url`; `sampling`: every episode's own sampling values (the
    `sampling` of POST /polarproxy/v1/episodes), None for the gateway's."""

    def __init__(self, url: str, token: str, sampling: dict[str, Any] | None = None) -> None:
        from polarproxy.client import Client

        self.url = url.rstrip("/")
        from urllib.parse import urlsplit

        self.port = urlsplit(self.url).port or 80
        self.db: str | None = None  # the running serve's store: this client is not told where it is
        self.client = Client(self.url, token)
        self.sampling = sampling

    def _do(self, fn: Any, *args: Any, **kw: Any) -> Any:
        import httpx

        from polarproxy.client import ControlError

        try:
            return fn(*args, **kw)
        except (ControlError, httpx.HTTPError) as e:
            raise _control_error(self.url, e) from e

    def check(self) -> None:
        self._do(self.client.episodes, limit=1)

    def create(
        self,
        *,
        task: str,
        group: str,
        harness: str | None,
        metadata: dict[str, str],
        command: list[str] | None = None,
    ) -> EpisodeHandle:
        handle: EpisodeHandle = self._do(
            self.client.create_episode,
            task=task,
            group=group,
            harness=harness,
            metadata=metadata,
            command=command,
            sampling=self.sampling,
        )
        return handle

    def _store_result(self, episode_id: str, result: VerifierResult) -> None:
        for seq, value in sorted(result.calls.items()):
            if value is not None:
                self._do(self.client.reward, episode_id, value, call=seq)

    def end(
        self,
        episode_id: str,
        *,
        exit_code: int,
        result: VerifierResult | None,
        stages: dict[str, float] | None = None,
    ) -> None:
        reward, graded = None, None
        if result is not None:
            self._store_result(episode_id, result)
            reward = result.reward if result.set_episode else None
            if reward is not None:  # stored with the episode's reward (per-call rewards carry none)
                graded = Graded(note=result.note, patch=result.patch, grading=result.grading)
        self._do(
            self.client.finish_episode,
            episode_id,
            exit_code=exit_code,
            reward=reward,
            graded=graded,
            stages=stages,
        )

    def calls_made(self, episode_id: str, group: str) -> int:
        for e in self._do(self.client.episodes, group=group, limit=PRIOR_LIMIT):
            if e["id"] == episode_id:
                return int(e.get("calls") or 0)
        return 0

    def prior(self, rollout_id: str, groups: list[str]) -> list[PriorEpisode]:
        out = []
        for group in groups:
            for e in self._do(self.client.episodes, group=group, limit=PRIOR_LIMIT):
                md = e.get("metadata") or {}
                if md.get("rollout_id") == rollout_id and "task_id" in md:
                    out.append(PriorEpisode(e["id"], e["status"], e.get("reward"), md))
        return out

    def close(self) -> None:
        self.client.close()


class LocalGateway(ControlEpisodes):
    """A gateway (mitmproxy + recorder + control API + backend client + store writer) on its own loop in
    a thread, as `serve` runs one, with a fresh control token. The verifier's result is written to the
    store directly, with where it came from (the command, its output tail); the end goes through the API."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.token = secrets.token_hex(24)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="polarproxy-gateway", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        super().__init__(self.proxy.url, self.token)
        from polarproxy.store.urls import display_url

        self.db = display_url(self.stack.store.url)  # where the episodes are stored (not the gateway's URL)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        from polarproxy.capture.proxy import serve_recorder
        from polarproxy.capture.stack import close_stack, open_stack
        from polarproxy.control.api import Control

        try:
            self.stack = await open_stack(self.cfg)
            # no default episode: with the control token every call needs an episode's API key
            self.proxy = await serve_recorder(self.stack, None, port=self.cfg.port)
            self.proxy.recorder.control = Control(
                self.stack.writer,
                token=self.token,
                default_episode=None,
                url=self.proxy.url,
                metadata={"model_dir": self.cfg.metadata["model_dir"]}
                if "model_dir" in self.cfg.metadata
                else None,
            )
            self._stop = asyncio.Event()
        except BaseException as e:  # handed to the starting thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.proxy.stop()
        await close_stack(self.stack)

    def _store_result(self, episode_id: str, result: VerifierResult) -> None:
        future = asyncio.run_coroutine_threadsafe(
            self.stack.writer.set_rewards(
                episode_id,
                episode=result.reward,
                set_episode=result.set_episode,
                calls=result.calls,
                origin=result.origin(),
            ),
            self.loop,
        )
        future.result()

    def calls_made(self, episode_id: str, group: str) -> int:
        return self.stack.store.answered_calls([episode_id]).get(episode_id, 0)

    def end(
        self,
        episode_id: str,
        *,
        exit_code: int,
        result: VerifierResult | None,
        stages: dict[str, float] | None = None,
    ) -> None:
        if result is not None:
            self._store_result(episode_id, result)
        self._do(self.client.finish_episode, episode_id, exit_code=exit_code, reward=None, stages=stages)

    def close(self) -> None:
        super().close()
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(60)
