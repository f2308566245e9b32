"""Typed domain errors.

Everything below the edges (REST API, Gradio UI, CLI) raises these. The edges map them to HTTP status codes,
`gr.Error` or an exit code; `http_status` is the single place that mapping lives.
"""

from __future__ import annotations


class TranslationError(Exception):
    """Base class. `message` is safe to show to a caller: no paths, no tracebacks."""

    http_status: int = 500
    #: True when the caller may simply retry later (busy, replica gone, ...).
    retryable: bool = False

    def __init__(self, message: str, short: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: LibreTranslate's own wording for this error, where LibreTranslate defines one ("zz is not supported"):
        #: the REST API answers it as `error`, which LibreTranslate's clients and tests compare, and `message` as
        #: `detail`. None where LibreTranslate has no such error: `message` is then the `error`.
        self.short = short


class ConfigError(TranslationError):
    """The configuration is invalid. The message names the offending key."""

    http_status = 500


class InvalidInput(TranslationError):
    """The request is malformed: empty text, bad field, bad encoding."""

    http_status = 400


class InputTooLarge(InvalidInput):
    """Text, batch or file over a configured limit. The message quotes both numbers."""

    http_status = 413


class UnsupportedLanguage(InvalidInput):
    """A language code that is not in the table (or malformed)."""

    http_status = 400


class UnreachablePair(TranslationError):
    """No direct adapter, no pivot route, and the bare backbone is not allowed."""

    http_status = 400

    def __init__(self, message: str, reachable: list[str] | None = None, short: str | None = None) -> None:
        super().__init__(message, short)
        self.reachable = reachable or []


class AdapterNotFound(TranslationError):
    """The registry has no adapter for this pair."""

    http_status = 404


class AdapterUnusable(TranslationError):
    """The adapter exists but failed validation or loading; the message carries the reason."""

    http_status = 503


class Busy(TranslationError):
    """Every slot is leased and the bounded wait ran out."""

    http_status = 503
    retryable = True


class OutOfMemory(TranslationError):
    """A single row could not fit even after the batch was split."""

    http_status = 507


class ModelUnavailable(TranslationError):
    """The backbone cannot be loaded (missing weights, no CUDA for a GPU profile, no download allowed)."""

    http_status = 503


class StoreUnavailable(TranslationError):
    """The store cannot be opened now (another process holds its migration lock past the bound)."""

    http_status = 503
    retryable = True


class ReplicaUnavailable(TranslationError):
    """Ray Serve: every attempt found the group's replica dead or unreachable (it is being restarted)."""

    http_status = 503
    retryable = True


class ServerStopping(TranslationError):
    """The server is stopping (SIGTERM, Ctrl-C) and stopped this call's work; a saved document job is not failed by
    it but left for the next start."""

    http_status = 503
    retryable = True


class UnsupportedDocument(InvalidInput):
    """A document whose format is not supported, lies about its type, or is corrupt."""

    http_status = 415


class Unauthorized(TranslationError):
    http_status = 403


class FeatureDisabled(TranslationError):
    """A LibreTranslate feature this server does not offer (suggestions): 403, as LibreTranslate answers it."""

    http_status = 403


class Cancelled(TranslationError):
    """The request was cancelled (its client disconnected, or a job was cancelled) before it was done. Nobody is
    usually left to read this; 499 is nginx's "client closed request"."""

    http_status = 499


class RateLimited(TranslationError):
    http_status = 429
    retryable = True

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def later(self, seconds: float) -> "RateLimited":
        """The same refusal said `seconds` later: the wait (and the message's "retry in N s") that much shorter."""
        import math
        import re

        left = max(1, math.ceil(self.retry_after_s - seconds))
        return RateLimited(re.sub(r"retry in \d+ s", f"retry in {left} s", self.message), left)


def http_status(exc: BaseException) -> int:
    """HTTP status for any exception; unknown exceptions are 500."""
    return exc.http_status if isinstance(exc, TranslationError) else 500
