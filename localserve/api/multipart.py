"""Reading untrusted multipart bodies (audio uploads, Files API uploads).

aiohttp's multipart reader reports a malformed body with plain exceptions:
`ValueError` ("Could not find starting boundary", "Invalid boundary",
"Reading after EOF", a boundary missing or too long, an undecodable
`_charset_`), `RuntimeError` ("Invalid default charset", unknown encodings)
and an `AssertionError` or two on input it did not expect. They say the
client's bytes are wrong, not the server, so they are a 400 here, never a 500.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from localserve.errors import InvalidRequestError

#: What aiohttp's multipart reader raises on a malformed body.
MALFORMED_MULTIPART = (ValueError, RuntimeError, AssertionError)


@contextmanager
def malformed_multipart_is_400(expected: str) -> Iterator[None]:
    """Turn the reader's exceptions inside the block into a 400 that says
    what is wrong and what a good body holds (`expected`). Keep the block to
    the reading itself: a `ValueError` of the server's own code must not
    pass for the client's fault."""
    try:
        yield
    except MALFORMED_MULTIPART as exc:
        detail = str(exc) or type(exc).__name__
        raise InvalidRequestError(
            f"The multipart/form-data body is malformed or truncated ({detail}). {expected}"
        ) from None
