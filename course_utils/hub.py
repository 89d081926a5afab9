"""The Hugging Face hub, asked once: whether it answers (hub_reachable, within $COURSE_HUB_CHECK_TIMEOUT), how
long one hub call may then take ($COURSE_HUB_TIMEOUT), no retry warnings while it waits, and whether a hub model's
config is already cached (then no call is needed). models.load_config puts them together; data.py re-exports the
check. Imports nothing of the course's own.
"""

from __future__ import annotations

import contextlib
import os
import socket


_TRUTHY = {"1", "true", "yes", "on"}


def _offline_mode() -> bool:
    """Return True if HF_HUB_OFFLINE (or HF_DATASETS_OFFLINE) is set to a truthy value."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUTHY
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_address() -> tuple[str, int]:
    """(host, port) of the hub: huggingface.co:443, or where HF_ENDPOINT points (a mirror, a test server)."""
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


HUB_CHECK_ENV = "COURSE_HUB_CHECK_TIMEOUT"  # seconds the hub check waits to connect, and then for a reply (2)


def hub_check_timeout() -> float:
    """How long hub_reachable waits (to connect, then for the reply): $COURSE_HUB_CHECK_TIMEOUT, default 2 s."""
    try:
        return max(0.01, float(os.environ.get(HUB_CHECK_ENV, "2")))
    except ValueError:
        return 2.0


def hub_answer(timeout: float | None = None) -> tuple[bool, str]:
    """(True, '') when the hub (huggingface.co:443, or HF_ENDPOINT) answers a request within `timeout` seconds to
    connect and as long again to reply; else (False, why): offline mode, no connection, or a connection that
    was accepted and never answered (a proxy or a firewall that holds it open)."""
    if _offline_mode():
        return False, "offline mode is set"
    timeout = hub_check_timeout() if timeout is None else timeout
    from urllib.parse import urlsplit

    host, port = hub_address()
    secure = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").scheme != "http"
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:  # no DNS, refused, timed out, no route...
        return False, f"no connection to {host}:{port} within {timeout:g} s ({type(exc).__name__})"
    try:
        conn.settimeout(timeout)
        if secure:
            import ssl

            conn = ssl.create_default_context().wrap_socket(conn, server_hostname=host)
        conn.sendall(f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        if not conn.recv(1):
            return False, f"{host}:{port} closed the connection without an answer"
        return True, ""
    except (socket.timeout, TimeoutError):
        return False, f"{host}:{port} accepted the connection but did not answer within {timeout:g} s"
    except OSError as exc:  # a TLS failure, a reset
        return False, f"{host}:{port} accepted the connection, then failed ({type(exc).__name__}: {exc})"
    finally:
        conn.close()


def hub_reachable(timeout: float | None = None) -> bool:
    """Return True if the hub (huggingface.co:443, or HF_ENDPOINT) answers a request within `timeout` seconds
    (hub_answer; False at once when offline mode is set, and for a connection accepted and never answered)."""
    LAST_HUB_ANSWER[0] = ""
    ok, LAST_HUB_ANSWER[0] = hub_answer(timeout)
    return ok


LAST_HUB_ANSWER = [""]  # why the last hub_reachable() call found no answer ("" when it did, or none was made)


HUB_TIMEOUT_ENV = "COURSE_HUB_TIMEOUT"  # seconds the course waits on one hub call (default 20)


def hub_timeout() -> float:
    """The deadline of one hub call, from $COURSE_HUB_TIMEOUT (default 20 s)."""
    try:
        return max(0.1, float(os.environ.get(HUB_TIMEOUT_ENV, "20")))
    except ValueError:
        return 20.0


@contextlib.contextmanager
def _quiet_hub():
    """No retry warnings from huggingface_hub and transformers while we wait (the error says it all)."""
    import logging

    loggers = [logging.getLogger(n) for n in ("huggingface_hub", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR + 10)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _in_hub_cache(model_id: str) -> bool:
    """True when a hub model's config is already in the local hub cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:
        return False
