"""Every error a client can see, in one place, each mapped to its HTTP status once.

The API layer turns a `LocalServeError` into the OpenAI error envelope
``{"error": {"message", "type", "param", "code"}}`` with `status`.
"""

from __future__ import annotations


class LocalServeError(Exception):
    """Base of all errors that reach a client."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    #: The request's body was not read to its end: answer, then close the connection.
    close_connection: bool = False

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(LocalServeError):
    status = 400
    type = "invalid_request_error"


class NotUnicodeError(InvalidRequestError):
    """Text that cannot be encoded as UTF-8: a lone UTF-16 surrogate, which
    JSON's `\\ud800` escape can carry (and Python's argv holds for an
    undecodable byte). The API refuses it at the edge, naming the field; the
    tokenizers refuse it too, for every other way text reaches them."""

    DEFAULT = (
        "The text holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair, or a byte "
        "that is not UTF-8), which is not valid Unicode. Send UTF-8 text."
    )

    def __init__(self, message: str = DEFAULT, *, param: str | None = None) -> None:
        super().__init__(message, param=param)


class ContextLengthError(InvalidRequestError):
    """A prompt the context cannot hold: llama-server's type, OpenAI's code
    (what clients match on), and with the counts the envelope carries
    `n_prompt_tokens` and `n_ctx` as llama-server's error does."""

    type = "exceed_context_size_error"
    code = "context_length_exceeded"

    def __init__(
        self, message: str, *, param: str | None = None, n_prompt_tokens: int | None = None, n_ctx: int | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx

    def envelope(self) -> dict[str, dict[str, str | None]]:
        body = super().envelope()
        if self.n_prompt_tokens is not None and self.n_ctx is not None:
            body["error"].update(n_prompt_tokens=self.n_prompt_tokens, n_ctx=self.n_ctx)  # type: ignore[call-overload]
        return body


class BodyReadError(InvalidRequestError):
    """The request body could not be read (a `Content-Encoding` that does not decode, ...)."""

    close_connection = True


class RequestTimeoutError(LocalServeError):
    """The client stopped sending its request body (see `--body-timeout`)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    close_connection = True


class AuthenticationError(LocalServeError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ForbiddenError(LocalServeError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFoundError(LocalServeError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class ModelNotDownloadedError(ModelNotFoundError):
    """A model the catalog knows, not on this machine: a client that names it
    means it (never served by another model instead); the message says how
    to get it."""


class NotSupportedError(LocalServeError):
    """A llama-server feature this server has switched off or does not have
    (llama-server's `not_supported_error`)."""

    status = 501
    type = "not_supported_error"


class PayloadTooLargeError(LocalServeError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class QueueFullError(LocalServeError):
    """The model's waiting queue is full; the client should retry later."""

    status = 503
    type = "server_overloaded"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelLoadingError(LocalServeError):
    status = 503
    type = "server_error"
    code = "model_loading"


class BackendError(LocalServeError):
    """A backend failed inside a step; only that step's requests fail."""

    status = 500
    type = "server_error"
    code = "backend_error"


class DeviceNotFoundError(LocalServeError):
    """A device the backend can use but does not see here (backends/device_names.py)."""

    status = 400
    type = "invalid_request_error"
    code = "device_not_found"


class UnsupportedDeviceError(DeviceNotFoundError):
    """A device name the backend can never serve, or no device name at all."""

    code = "unsupported_device"


class EngineStoppedError(LocalServeError):
    status = 503
    type = "server_error"
    code = "engine_stopped"


class PullError(LocalServeError):
    """A model could not be fetched from its hub (network, HTTP error, offline, disk)."""

    status = 502
    type = "server_error"
    code = "pull_failed"


class ChecksumMismatchError(PullError):
    """A downloaded file is not the file its digest names; it was deleted."""

    code = "checksum_mismatch"


class InsufficientStorageError(LocalServeError):
    """The disk is full (or read-only) where the request must write: an upload,
    a pull, a conversion (disk.py names the folder and the space free)."""

    status = 507
    type = "server_error"
    code = "insufficient_storage"


class JobStoreBusyError(LocalServeError):
    """Another localserve process runs the batch jobs of this data directory."""

    status = 503
    type = "server_error"
    code = "job_store_busy"


class LlamaCppBuildError(LocalServeError):
    """The installed llama.cpp library dies on this CPU (backends/llamacpp/selfcheck.py)."""

    code = "llama_cpp_build_crashes"
