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


class ContextLengthError(InvalidRequestError):
    code = "context_length_exceeded"


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
    status = 400
    type = "invalid_request_error"
    code = "device_not_found"


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


class JobStoreBusyError(LocalServeError):
    """Another localserve process runs the batch jobs of this data directory."""

    status = 503
    type = "server_error"
    code = "job_store_busy"
