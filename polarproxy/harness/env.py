"""The one environment that points every provider SDK at the proxy: `record`'s child, a `rollout` episode's
harness and `polarproxy.client.EpisodeHandle.env()` all take it from here."""

from __future__ import annotations

from collections.abc import Mapping

PLACEHOLDER_KEY = "sk-polarproxy-local"  # `record`'s key: the proxy does not check it
# polarproxy's own secrets: the store's URL (a password in it), the control and sync keys. `record` passes
# the user's environment on (intercept mode needs the real provider key), but never these.
HOST_ONLY = ("POLARPROXY_DB", "POLARPROXY_CONTROL_TOKEN", "POLARPROXY_SYNC_API_KEY")


def base_urls(proxy_url: str) -> dict[str, str]:
    """The base URL each SDK family takes for a proxy at `proxy_url` (OpenAI's ends in /v1)."""
    root = proxy_url.rstrip("/")
    return {"openai": f"{root}/v1", "anthropic": root, "gemini": root}


def sdk_env(urls: Mapping[str, str], key: str, episode_id: str) -> dict[str, str]:
    """Variables that point the OpenAI, Anthropic and Gemini SDKs at the proxy with `key`, and tell the
    harness its episode (`urls` as `base_urls` gives them, or as the control API answers them)."""
    return {
        "OPENAI_BASE_URL": urls["openai"],
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": urls["anthropic"],
        "ANTHROPIC_API_KEY": key,
        "GOOGLE_GEMINI_BASE_URL": urls["gemini"],
        "GEMINI_API_KEY": key,
        "POLARPROXY_URL": urls["anthropic"],
        "POLARPROXY_EPISODE": episode_id,
    }


def harness_env(
    base: Mapping[str, str], urls: Mapping[str, str], key: str, episode_id: str
) -> dict[str, str]:
    """`base` with the SDK variables set (`sdk_env`), an Anthropic auth token dropped (it would win over the
    key) and polarproxy's own secrets (`HOST_ONLY`) left out."""
    env = without_host_secrets(base)
    env.update(sdk_env(urls, key, episode_id))
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    return env


def without_host_secrets(base: Mapping[str, str]) -> dict[str, str]:
    """`base` less polarproxy's own secrets (`HOST_ONLY`)."""
    return {k: v for k, v in base.items() if k not in HOST_ONLY}
