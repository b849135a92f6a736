from polarproxy.redact import REDACTED, is_secret_name, redact_argv, redact_headers, redact_path, redact_text


def test_secret_headers_are_replaced_whatever_their_case():
    out = redact_headers(
        [
            ("Authorization", "Bearer sk-1"),
            ("X-Api-Key", "k"),
            ("x-goog-api-key", "g"),
            ("api-key", "a"),
            ("Cookie", "s=1"),
            ("Content-Type", "application/json"),
        ]
    )
    assert out == {
        "Authorization": REDACTED,
        "X-Api-Key": REDACTED,
        "x-goog-api-key": REDACTED,
        "api-key": REDACTED,
        "Cookie": REDACTED,
        "Content-Type": "application/json",
    }


def test_repeated_headers_are_joined():
    assert redact_headers([("accept", "a"), ("accept", "b")]) == {"accept": "a, b"}


def test_secret_query_parameters_are_replaced_and_the_rest_kept_verbatim():
    path = "/v1beta/models/m:streamGenerateContent?alt=sse&key=AIzaSECRET&x=a%2Fb"
    assert redact_path(path) == "/v1beta/models/m:streamGenerateContent?alt=sse&key=%3Credacted%3E&x=a%2Fb"
    assert redact_path("/v1/messages?beta=true") == "/v1/messages?beta=true"
    assert redact_path("/v1/chat/completions") == "/v1/chat/completions"


# ---- command lines ---------------------------------------------------------------------------------------


def test_a_curl_authorization_header_on_the_command_line_is_redacted():
    argv = [
        "curl",
        "-s",
        "https://api.openai.com/v1/models",
        "-H",
        "Authorization: Bearer sk-proj-abc123DEF456ghi",
    ]
    assert redact_argv(argv) == [
        "curl",
        "-s",
        "https://api.openai.com/v1/models",
        "-H",
        f"Authorization: {REDACTED}",
    ]
    assert redact_argv(["curl", "--header=x-api-key: k-1"]) == ["curl", f"--header=x-api-key: {REDACTED}"]


def test_secret_option_values_are_redacted_in_both_spellings():
    argv = [
        "aider",
        "--api-key",
        "abc",
        "--token=t0k",
        "--password",
        "hunter2",
        "--openai-api-key",
        "q",
        "--auth",
        "u",
    ]
    assert redact_argv(argv) == [
        "aider",
        "--api-key",
        REDACTED,
        f"--token={REDACTED}",
        "--password",
        REDACTED,
        "--openai-api-key",
        REDACTED,
        "--auth",
        REDACTED,
    ]


def test_options_that_only_mention_tokens_are_kept():
    argv = [
        "run",
        "--max-tokens",
        "5",
        "--key-file",
        "k.pem",
        "--no-auth",
        "--port",
        "80",
        "--tokenizer",
        "t",
    ]
    assert redact_argv(argv) == argv
    assert not is_secret_name("PWD") and not is_secret_name("--max-tokens") and is_secret_name("PGPASSWORD")


def test_secret_assignments_are_redacted():
    argv = [
        "env",
        "OPENAI_API_KEY=abc",
        "HF_TOKEN=x",
        "AWS_SECRET=y",
        "PGPASSWORD=z",
        "db_password=w",
        "MAX_TOKENS=9",
    ]
    assert redact_argv(argv) == [
        "env",
        f"OPENAI_API_KEY={REDACTED}",
        f"HF_TOKEN={REDACTED}",
        f"AWS_SECRET={REDACTED}",
        f"PGPASSWORD={REDACTED}",
        f"db_password={REDACTED}",
        "MAX_TOKENS=9",
    ]


def test_provider_shaped_keys_are_redacted_wherever_they_appear():
    argv = [
        "tool",
        "sk-ant-api03-abcdefgh",
        '{"model": "m", "x": "ghp_abcdefghijklmnop1234"}',
        "AIzaSyA1234567890abcdefghij",
    ]
    assert redact_argv(argv) == ["tool", REDACTED, f'{{"model": "m", "x": "{REDACTED}"}}', REDACTED]


def test_url_passwords_and_key_query_parameters_are_redacted():
    argv = ["psql", "postgresql://bob:s3cret@db.local:5432/x", "https://h/v1?key=AIzaQ&alt=sse"]
    assert redact_argv(argv) == [
        "psql",
        f"postgresql://bob:{REDACTED}@db.local:5432/x",
        "https://h/v1?key=%3Credacted%3E&alt=sse",
    ]
    assert redact_argv(["curl", "-u", "bob:pw", "http://x"]) == ["curl", "-u", f"bob:{REDACTED}", "http://x"]


def test_json_members_named_as_secrets_are_redacted():
    assert redact_text('{"api_key": "abc", "password": "p\\"q", "model": "m"}') == (
        f'{{"api_key": "{REDACTED}", "password": "{REDACTED}", "model": "m"}}'
    )


def test_an_ordinary_command_line_is_kept_verbatim():
    argv = [
        "codex",
        "exec",
        "--skip-git-repo-check",
        "List the files, then say done.",
        "-m",
        "gpt-5",
        "--",
        "x=1",
    ]
    assert redact_argv(argv) == argv
    assert redact_argv(["python", "-u", "agent.py"]) == ["python", "-u", "agent.py"]


def test_redaction_is_idempotent():
    argv = ["curl", "-H", "Authorization: Bearer sk-abcdefghijk", "--api-key", "z", "https://u:p@h/?token=t"]
    once = redact_argv(argv)
    assert redact_argv(once) == once


def test_the_store_redacts_a_command_line_that_reaches_it_unredacted(tmp_path, caplog):
    from polarproxy.store.records import EpisodeStart
    from polarproxy.store.store import Store

    store = Store.open(str(tmp_path / "s.db"))
    eid = store.create_episode(EpisodeStart(command=["agent", "--api-key", "abc123", "HF_TOKEN=hf-x"]))
    assert store.get_episode(eid).command == ["agent", "--api-key", REDACTED, f"HF_TOKEN={REDACTED}"]
    assert "unredacted" in caplog.text
    for f in tmp_path.glob("s.db*"):
        assert b"abc123" not in f.read_bytes() and b"hf-x" not in f.read_bytes()


def test_custom_auth_headers_and_signed_query_values_are_redacted():
    headers = redact_headers(
        [
            ("x-auth-token", "t0ken"),
            ("X-Amz-Security-Token", "amz"),
            ("x-goog-signature", "sig"),
            ("session_id", "s-1"),
            ("x-client-secret", "shh"),
            ("content-type", "application/json"),
            ("keep-alive", "timeout=5"),
        ]
    )
    assert headers == {
        "x-auth-token": REDACTED,
        "X-Amz-Security-Token": REDACTED,
        "x-goog-signature": REDACTED,
        "session_id": REDACTED,
        "x-client-secret": REDACTED,
        "content-type": "application/json",
        "keep-alive": "timeout=5",
    }
    path = redact_path("/v1/x?sig=abc&code=123&signature=s&password=p&secret=q&alt=sse")
    assert path == "/v1/x?" + "&".join(
        [*(f"{n}=%3Credacted%3E" for n in ("sig", "code", "signature", "password", "secret")), "alt=sse"]
    )


def test_name_value_secrets_in_free_text_are_redacted():
    text = "ok token=abc123 PASSWORD=hunter2 db_password=x1 max_tokens=5 session=77 path=/tmp/x"
    assert redact_text(text) == (
        f"ok token={REDACTED} PASSWORD={REDACTED} db_password={REDACTED} max_tokens=5 session={REDACTED} "
        "path=/tmp/x"
    )
