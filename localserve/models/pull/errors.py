"""huggingface_hub's failures as one line that says what to do."""

from __future__ import annotations

from localserve.errors import LocalServeError, PullError


def hub_error(exc: BaseException, what: str, endpoint: str) -> LocalServeError:
    """The error to show for `exc`, raised while fetching `what` from `endpoint`."""
    from huggingface_hub import errors

    if isinstance(exc, LocalServeError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, errors.GatedRepoError):
        return PullError(f"{what} is gated on {endpoint}: accept its terms on the hub, then set HF_TOKEN")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return PullError(f"{what} is not on the hub at {endpoint} (if it is private, set HF_TOKEN)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return PullError(f"{what}: no such revision on the hub at {endpoint}")
    if isinstance(exc, errors.EntryNotFoundError) and not isinstance(exc, errors.LocalEntryNotFoundError):
        return PullError(f"not found on the hub at {endpoint}: {what}")
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(exc, errors.HfHubHTTPError) and status is not None:
        if status in (401, 403):
            return PullError(f"the hub at {endpoint} refused {what} (HTTP {status}): set HF_TOKEN")
        return PullError(f"the hub at {endpoint} answered HTTP {status} for {what}")
    if isinstance(exc, OSError | errors.LocalEntryNotFoundError) or "Connect" in name or "Timeout" in name:
        return PullError(
            f"cannot reach the Hugging Face Hub at {endpoint} ({_reason(exc)}): check the network, "
            "set HF_ENDPOINT to a mirror, or set HF_HUB_OFFLINE=1 to use only models already downloaded"
        )
    return PullError(f"pulling {what} from {endpoint} failed: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    """The root cause, in a few words ("Name or service not known", "Connection refused")."""
    seen: set[int] = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for marker in ("Name or service not known", "Connection refused", "timed out", "No route to host",
                   "Temporary failure in name resolution", "Network is unreachable"):  # fmt: skip
        if marker in text:
            return marker
    return text[:160]
