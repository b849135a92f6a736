"""Named, ordered schema migrations, recorded in `_migrations(name, applied_at)`.

Add a migration by appending a function decorated with `@migration` and named `mNNN_what_it_does`; never
edit or reorder one that has shipped. Each migration holds its own DDL (not the current tables in schema.py),
so a blank database and an upgraded one end in the same state. `migrate` applies the missing ones, in order,
in one transaction that holds the write lock, so two processes opening one new database do not race.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    select,
    text,
)

from polarproxy.store.engine import write_transaction

MIGRATIONS: list[Callable[[Connection], None]] = []


def migration(fn: Callable[[Connection], None]) -> Callable[[Connection], None]:
    MIGRATIONS.append(fn)
    return fn


_meta = MetaData()
migrations_table = Table(
    "_migrations",
    _meta,
    Column("name", String, primary_key=True),
    Column("applied_at", String, nullable=False),
)


def applied_migrations(conn: Connection) -> list[str]:
    """Names of the migrations recorded in the database, in the order they were applied."""
    migrations_table.create(conn, checkfirst=True)
    rows = conn.execute(select(migrations_table.c.name).order_by(migrations_table.c.applied_at))
    return [name for (name,) in rows]


def sampling_recorded_since(conn: Connection) -> float:
    """When m005 was applied (seconds since the epoch): every call started later has its request's temperature
    in `calls.temperature`; an older call may have NULL there and the temperature in its request only.
    Calls' clocks may run behind the migrating process's; such a call just reads its request. +inf while
    m005 is not recorded."""
    name = m005_rewards_and_sampling.__name__
    applied = conn.execute(
        select(migrations_table.c.applied_at).where(migrations_table.c.name == name)
    ).scalar()
    return datetime.datetime.fromisoformat(applied).timestamp() if applied else float("inf")


def migrate(engine: Engine) -> list[str]:
    """Apply the migrations the database lacks; return their names (empty when it was up to date)."""
    applied: list[str] = []
    with write_transaction(engine) as conn:
        if conn.dialect.name == "postgresql":  # serialize concurrent migrators; released at commit
            conn.execute(text("SELECT pg_advisory_xact_lock(7427031)"))
        done = set(applied_migrations(conn))
        for fn in MIGRATIONS:
            if fn.__name__ in done:
                continue
            fn(conn)
            conn.execute(
                migrations_table.insert().values(
                    name=fn.__name__, applied_at=datetime.datetime.now(datetime.UTC).isoformat()
                )
            )
            applied.append(fn.__name__)
    return applied


@migration
def m001_initial(conn: Connection) -> None:
    meta = MetaData()
    Table(
        "episodes",
        meta,
        Column("id", String, primary_key=True),
        Column("command_json", Text, nullable=False),
        Column("harness", String),
        Column("cwd", Text),
        Column("task", Text),
        Column("group_id", String),
        Column("reward", Float),
        Column("status", String, nullable=False),
        Column("exit_code", Integer),
        Column("started_at", Float, nullable=False),
        Column("ended_at", Float),
        Column("metadata_json", Text, nullable=False),
        Column("next_seq", Integer, nullable=False, server_default="0"),
        Index("ix_episodes_started_at", "started_at"),
    )
    Table(
        "calls",
        meta,
        Column("id", String, primary_key=True),
        Column("episode_id", String, ForeignKey("episodes.id"), nullable=False),
        Column("seq", Integer, nullable=False),
        Column("dialect", String, nullable=False),
        Column("method", String, nullable=False),
        Column("path", Text, nullable=False),
        Column("model", Text, nullable=False),
        Column("stream", Boolean, nullable=False),
        Column("status", String, nullable=False),
        Column("error", Text),
        Column("http_status", Integer),
        Column("request_headers_json", Text, nullable=False),
        Column("request_body", Text, nullable=False),
        Column("response_body", Text),
        Column("conversation_json", Text),
        Column("completion_json", Text),
        Column("prompt_base_call_id", String, ForeignKey("calls.id")),
        Column("prompt_base_len", Integer, nullable=False, server_default="0"),
        Column("prompt_tail_ids", LargeBinary, nullable=False),
        Column("prompt_len", Integer, nullable=False),
        Column("output_ids", LargeBinary, nullable=False),
        Column("output_logprobs", LargeBinary, nullable=False),
        Column("output_len", Integer, nullable=False, server_default="0"),
        Column("finish_reason", String),
        Column("weight_version", String),
        Column("backend", Text, nullable=False),
        Column("backend_kind", String, nullable=False),
        Column("fidelity", String, nullable=False),
        Column("render_mode", String, nullable=False),
        Column("extended_from", String),
        Column("render_note", Text),
        Column("started_at", Float, nullable=False),
        Column("ended_at", Float),
        Column("latency_ms", Float),
        Column("ttft_ms", Float),
        Column("prompt_tokens", Integer),
        Column("completion_tokens", Integer),
        Column("reward", Float),
        Index("ix_calls_episode_seq", "episode_id", "seq", unique=True),
        Index("ix_calls_status", "status"),
    )
    meta.create_all(conn)


@migration
def m002_writers(conn: Connection) -> None:
    """Who records each running episode (store/owners.py), so that a crashed proxy's
    in-flight calls can be told from a live one's. One `writers` row per recording process, with the
    heartbeat it refreshes; `episodes.writer_id` names the process that records the episode."""
    meta = MetaData()
    Table(
        "writers",
        meta,
        Column("id", String, primary_key=True),
        Column("host", String, nullable=False),
        Column("pid", Integer, nullable=False),
        Column("machine", String),
        Column("proc_start", String),
        Column("started_at", Float, nullable=False),
        Column("heartbeat_at", Float, nullable=False),
    )
    meta.create_all(conn)
    conn.execute(text("ALTER TABLE episodes ADD COLUMN writer_id VARCHAR"))
    conn.execute(text("CREATE INDEX ix_episodes_status ON episodes (status)"))


@migration
def m003_calls_prompt_base_index(conn: Connection) -> None:
    """Linear-size token storage: calls store prompts as references to earlier calls, so
    finding the calls that use a call as their base (finishing it again, deleting an episode: PostgreSQL
    checks the foreign key for every deleted row) must not scan the table."""
    conn.execute(text("CREATE INDEX ix_calls_prompt_base ON calls (prompt_base_call_id)"))


@migration
def m004_calls_bodies_delta(conn: Connection) -> None:
    """Harnesses resend the whole history, so request bodies grow quadratically per
    episode; a call with a prompt base may store its request body and conversation as compressed edits of
    the base's (store/textdelta.py). Rows written before keep their bodies whole (the column is NULL)."""
    blob = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
    conn.execute(text(f"ALTER TABLE calls ADD COLUMN bodies_delta {blob}"))


@migration
def m005_rewards_and_sampling(conn: Connection) -> None:
    """Rewards for groups and GRPO batches: a `rewards` table that says where each reward came from
    (a verifier command, `polarproxy reward`, the proxy's HTTP endpoint), and per call the sampling
    temperature and the weight versions of the first and last answer chunks (a weight update mid-call)."""
    meta = MetaData()
    Table("episodes", meta, Column("id", String, primary_key=True))
    Table(
        "rewards",
        meta,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("episode_id", String, ForeignKey("episodes.id"), nullable=False),
        Column("call_seq", Integer),
        Column("call_id", String),
        Column("reward", Float),
        Column("source", String, nullable=False),
        Column("command_json", Text),
        Column("exit_code", Integer),
        Column("output_tail", Text),
        Column("note", Text),
        Column("created_at", Float, nullable=False),
        Index("ix_rewards_episode", "episode_id"),
    )
    meta.tables["rewards"].create(conn)
    for column, sql_type in (
        ("temperature", "FLOAT"),  # PostgreSQL: double precision, as SQLAlchemy's Float
        ("weight_version_first", "VARCHAR"),
        ("weight_version_last", "VARCHAR"),
    ):
        conn.execute(text(f"ALTER TABLE calls ADD COLUMN {column} {sql_type}"))


@migration
def m006_episode_keys(conn: Connection) -> None:
    """`serve` as a multi-episode gateway: the API key of each episode created through the control
    API, as a SHA-256 hash (a harness's calls carrying the key belong to the episode), and the order in which
    episodes were finished there (the cursor of the trajectory stream)."""
    meta = MetaData()
    Table("episodes", meta, Column("id", String, primary_key=True))
    Table(
        "episode_keys",
        meta,
        Column("episode_id", String, ForeignKey("episodes.id"), primary_key=True),
        Column("key_hash", String, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("finished_at", Float),
        Index("ix_episode_keys_key_hash", "key_hash", unique=True),
    )
    Table(
        "episode_finishes",
        meta,
        Column("seq", Integer, primary_key=True, autoincrement=True),
        Column("episode_id", String, ForeignKey("episodes.id"), nullable=False),
        Column("finished_at", Float, nullable=False),
        Index("ix_episode_finishes_episode", "episode_id"),
    )
    meta.tables["episode_keys"].create(conn)
    meta.tables["episode_finishes"].create(conn)


@migration
def m007_logprob_temperature(conn: Connection) -> None:
    """Logprobs at the sampler's temperature: per call, the temperature the backend's logprobs
    are at (scaled: the sampling temperature; raw: 1). NULL for older calls: derived from the backend kind
    on read."""
    conn.execute(text("ALTER TABLE calls ADD COLUMN logprob_temperature FLOAT"))


@migration
def m008_top_p_top_k(conn: Connection) -> None:
    """Per call, the top_p and top_k the gateway sent (a truncated distribution's logprobs are of
    the untruncated one: export rows flag them)."""
    conn.execute(text("ALTER TABLE calls ADD COLUMN top_p FLOAT"))
    conn.execute(text("ALTER TABLE calls ADD COLUMN top_k INTEGER"))


@migration
def m009_reward_grading(conn: Connection) -> None:
    """SWE-bench grading: with each reward, the agent's changes as a diff and the grader's
    per-test results (NULL for rewards set otherwise, and for older ones)."""
    conn.execute(text("ALTER TABLE rewards ADD COLUMN patch TEXT"))
    conn.execute(text("ALTER TABLE rewards ADD COLUMN grading_json TEXT"))


@migration
def m010_episode_stages(conn: Connection) -> None:
    """Comparing harnesses: the seconds each rollout stage of the episode took (prewarm, execute,
    evaluate), set when it ends; NULL for episodes not run by `rollout`, and for older ones."""
    conn.execute(text("ALTER TABLE episodes ADD COLUMN stages_json TEXT"))
