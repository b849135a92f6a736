from polarproxy.redact import REDACTED, redact_headers, redact_path


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
