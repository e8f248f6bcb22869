"""Pull a model's files from the Hugging Face Hub (or a mirror) into the store.

The hub's file endpoint is `{HF_ENDPOINT}/{repo}/resolve/{revision}/{file}`;
a HEAD answers the size and digest (`X-Linked-Size` and `X-Linked-Etag`, the
sha256 of an LFS file; else `Content-Length` and `ETag`, the git blob sha1
of a small file) and the commit (`X-Repo-Commit`), which every GET then pins
so that a resumed download cannot mix two versions. `huggingface_hub` builds
the URLs and the headers (token from `HF_TOKEN` or `huggingface-cli login`);
the transfer is ours, because `hf_hub_download` reports progress only through
tqdm, puts the file in place before we could check a digest, and changed its
transfer internals across the versions we support. Ours:

* writes `NAME.DIGEST.partial` beside the target and resumes it with an HTTP
  `Range` request after a dropped connection or in a later pull;
* checks the size and the digest (sha256: the catalog's, else the hub's;
  git sha1 for small files), deletes a file that does not match, and only
  then renames it into place (`os.replace`);
* writes the model's manifest last: until then the model is not downloaded.

`HF_HUB_OFFLINE=1` forbids the network: a pull succeeds only for a model that
is already in the store. Blocking code: the server runs it in a thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urljoin

import httpx

from localserve import __version__
from localserve.errors import ChecksumMismatchError, InvalidRequestError, ModelNotFoundError, PullError
from localserve.models.catalog import CatalogEntry, HubSource, load_catalog, parse_hub_uri
from localserve.models.store import MANIFEST, PARTIAL_SUFFIX, Manifest, ModelStore, StoredFile, validate_model_id

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK_BYTES = 1 << 20
PROGRESS_INTERVAL_S = 0.1
RETRY_BACKOFF_S = (0.2, 1.0, 2.0, 4.0, 8.0)  # per failure in a row; progress resets the count
_HEX64, _HEX40 = re.compile(r"[0-9a-f]{64}"), re.compile(r"[0-9a-f]{40}")


class PullCancelled(Exception):
    """The caller stopped the pull; the `.partial` file stays for a later resume."""


class _Retryable(Exception):
    """A failure worth another try (server error, early end of the body)."""


@dataclass(frozen=True, slots=True)
class PullProgress:
    """One progress report: `status` is "resolving", "downloading",
    "verifying", "exists" (nothing to do) or "success"."""

    model_id: str
    status: str
    file: str = ""
    completed: int = 0  # bytes of `file` on disk
    total: int = 0  # bytes of `file` (0: unknown)
    rate_bytes_per_s: float = 0.0
    eta_s: float | None = None
    file_index: int = 0
    num_files: int = 0


ProgressCallback = Callable[[PullProgress], None]


@dataclass(frozen=True, slots=True)
class PullPlan:
    model_id: str
    hub: HubSource
    labels: tuple[str, ...] = ()  # () = detect from the files once downloaded


@dataclass(frozen=True, slots=True)
class RemoteFile:
    name: str
    url: str  # pinned to the commit when the hub named one
    size: int | None
    sha256: str | None
    git_sha1: str | None
    commit: str


# ---- environment ---------------------------------------------------------------------


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_ENDPOINT


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_headers() -> dict[str, str]:
    """User agent and `Authorization` (HF_TOKEN, else the saved login) as huggingface_hub sends them."""
    from huggingface_hub.utils import build_hf_headers

    token = os.environ.get("HF_TOKEN", "").strip() or None  # read now: huggingface_hub reads it at import
    return dict(build_hf_headers(token=token, library_name="localserve", library_version=__version__))


# ---- what to pull --------------------------------------------------------------------


def plan_pull(ref: str, *, name: str | None = None, catalog: Mapping[str, CatalogEntry] | None = None) -> PullPlan:
    """A catalog id, or `hf://OWNER/REPO[@REV]/FILE` stored as `name` (default: from the file name)."""
    if ref.startswith("hf://"):
        hub = parse_hub_uri(ref)
        return PullPlan(validate_model_id(default_model_id(hub) if name is None else name), hub)
    model_id = validate_model_id(ref)
    catalog = load_catalog() if catalog is None else catalog
    entry = catalog.get(model_id)
    if entry is None:
        raise ModelNotFoundError(
            f"unknown model {model_id!r}: pull a catalog id (see `localserve list`) or hf://OWNER/REPO/FILE",
            param="model",
        )
    source = entry.hub_source()
    if source is None:
        hints = "; ".join(s.install for s in entry.sources if s.install) or "it has no hub source"
        raise InvalidRequestError(f"model {model_id!r} is not on a model hub: {hints}", param="model")
    return PullPlan(model_id, source, entry.labels)


def default_model_id(hub: HubSource) -> str:
    stem = Path(hub.main).name.rsplit(".", 1)[0] if hub.main else hub.repo.split("/")[1]
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.")[:128] or "model"


# ---- the pull ------------------------------------------------------------------------


def pull(
    plan: PullPlan,
    *,
    store: ModelStore | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    force: bool = False,
) -> Manifest:
    """Download every file of `plan` into the store and write its manifest."""
    store = store or ModelStore()
    report = progress or (lambda _: None)
    existing = store.manifest(plan.model_id)
    if existing is not None and not force and existing.source == plan.hub.uri:
        report(PullProgress(plan.model_id, "exists", total=existing.size_bytes, completed=existing.size_bytes))
        return existing
    if is_offline():
        raise PullError(f"cannot pull {plan.model_id!r}: HF_HUB_OFFLINE is set and the model is not in the store")
    (store.model_dir(plan.model_id) / MANIFEST).unlink(missing_ok=True)  # not "downloaded" while files change
    report(PullProgress(plan.model_id, "resolving", num_files=len(plan.hub.files)))
    with HubClient() as client:
        remotes = [client.metadata(plan.hub, name) for name in plan.hub.files]
        check_disk_space(store, plan.model_id, remotes)
        stored = []
        try:
            for index, remote in enumerate(remotes):
                target = store.file_path(plan.model_id, remote.name)
                meter = _Meter(plan.model_id, remote, index, len(remotes), report)
                stored.append(client.download(remote, target, meter, cancel))
        except ChecksumMismatchError:
            for done in stored:  # a refused model leaves nothing behind
                store.file_path(plan.model_id, done.name).unlink(missing_ok=True)
            store.discard_if_empty(plan.model_id)
            raise
    labels = plan.labels or _detect_labels(store, plan)
    manifest = Manifest(
        plan.model_id, plan.hub.uri, plan.hub.revision, tuple(stored), plan.hub.main, labels, remotes[0].commit
    )
    store.write_manifest(manifest)
    report(PullProgress(plan.model_id, "success", total=manifest.size_bytes, completed=manifest.size_bytes))
    return manifest


def check_disk_space(store: ModelStore, model_id: str, remotes: list[RemoteFile]) -> None:
    folder = store.model_dir(model_id)
    folder.mkdir(parents=True, exist_ok=True)
    needed = sum(r.size or 0 for r in remotes)
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise PullError(f"not enough disk space for {model_id!r} in {folder}: needs {needed:,} bytes, {free:,} free")


def _detect_labels(store: ModelStore, plan: PullPlan) -> tuple[str, ...]:
    from localserve.models.oneshot import detect_labels  # reads file headers only

    folder = store.model_dir(plan.model_id)
    return detect_labels(folder / plan.hub.main if plan.hub.main else folder) or ("chat",)


# ---- HTTP ----------------------------------------------------------------------------


class HubClient:
    """HEAD and ranged GET against the hub's file endpoint."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint or hub_endpoint()
        timeout = httpx.Timeout(30.0, read=60.0)
        self.http = httpx.Client(headers=hub_headers(), timeout=timeout, follow_redirects=False)

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.http.close()

    def url(self, hub: HubSource, name: str, revision: str) -> str:
        from huggingface_hub import hf_hub_url

        return str(hf_hub_url(hub.repo, name, revision=revision, endpoint=self.endpoint))

    def metadata(self, hub: HubSource, name: str) -> RemoteFile:
        response = _retrying(lambda: self._head(self.url(hub, name, hub.revision)), f"{hub.repo}/{name}")
        headers = response.headers
        etag = _normalize_etag(headers.get("X-Linked-Etag") or headers.get("ETag") or "")
        size_text = headers.get("X-Linked-Size") or headers.get("Content-Length")
        commit = headers.get("X-Repo-Commit", "")
        hub_sha256 = etag if _HEX64.fullmatch(etag) else None
        pinned = hub.sha256.get(name)
        if pinned and hub_sha256 and pinned != hub_sha256:
            raise ChecksumMismatchError(
                f"{hub.repo}/{name}: the catalog pins sha256 {pinned} but the hub serves {hub_sha256}; not downloading"
            )
        sha256 = pinned or hub_sha256
        git_sha1 = etag if sha256 is None and _HEX40.fullmatch(etag) else None
        revision = commit if _HEX40.fullmatch(commit) else hub.revision
        size = int(size_text) if size_text and size_text.isdigit() else None
        return RemoteFile(name, self.url(hub, name, revision), size, sha256, git_sha1, commit)

    def _head(self, url: str) -> httpx.Response:
        for _ in range(5):
            response = self.http.head(url, headers={"Accept-Encoding": "identity"})
            linked = "X-Linked-Size" in response.headers or "X-Linked-Etag" in response.headers
            if not response.is_redirect or linked:
                break
            url = urljoin(str(response.url), response.headers["Location"])  # a renamed repo
        _check_status(response, url)
        return response

    def download(self, remote: RemoteFile, target: Path, meter: _Meter, cancel: threading.Event | None) -> StoredFile:
        """Fetch `remote` to `target` through a resumable `.partial` file, verified."""
        tag = (remote.sha256 or remote.git_sha1 or "nodigest")[:16]
        partial = target.with_name(f"{target.name}.{tag}{PARTIAL_SUFFIX}")
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f"{glob_escape(target.name)}.*{PARTIAL_SUFFIX}"):
            if stale != partial:
                stale.unlink(missing_ok=True)
        digest = _Digest(remote)
        if target.is_file() and target.stat().st_size == remote.size:  # an earlier, interrupted pull got it
            with target.open("rb") as done:
                digest.resume(done, remote.size)
            if not digest.mismatch(remote):
                meter.start(digest.num_bytes)
                return StoredFile(remote.name, digest.num_bytes, digest.sha256.hexdigest())
            digest.restart(None)
        with partial.open("a+b") as out:
            digest.resume(out, remote.size)
            if digest.num_bytes:
                log.info("resuming %s at byte %d", remote.name, digest.num_bytes)
            meter.start(digest.num_bytes)
            _retrying(lambda: self._fetch(remote, out, digest, meter, cancel), remote.name, progress=digest)
        meter.verifying()
        problem = digest.mismatch(remote)
        if problem:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatchError(f"{remote.name}: {problem}; the download was deleted")
        os.replace(partial, target)
        return StoredFile(remote.name, digest.num_bytes, digest.sha256.hexdigest())

    def _fetch(
        self, remote: RemoteFile, out: BinaryIO, digest: _Digest, meter: _Meter, cancel: threading.Event | None
    ) -> None:
        offset = digest.num_bytes
        if remote.size is not None and offset == remote.size:
            return
        headers = {"Accept-Encoding": "identity"} | ({"Range": f"bytes={offset}-"} if offset else {})
        with self.http.stream("GET", remote.url, headers=headers, follow_redirects=True) as response:
            if offset and response.status_code == 200:  # the server ignored Range: start over
                digest.restart(out)
                meter.start(0)
            elif offset and response.status_code == 206:
                start = response.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
                if start != str(offset):
                    raise PullError(f"{remote.name}: asked for bytes from {offset}, got {start or 'no range'}")
            else:
                _check_status(response, remote.url)
            for chunk in response.iter_raw():  # as it arrives: a drop loses nothing already received
                if cancel is not None and cancel.is_set():
                    raise PullCancelled(remote.name)
                out.write(chunk)
                digest.update(chunk)
                meter.update(digest.num_bytes)
        out.flush()
        if remote.size is not None and digest.num_bytes < remote.size:
            raise _Retryable(f"the connection ended at byte {digest.num_bytes} of {remote.size}")


def _retrying(fn: Callable[[], object], what: str, *, progress: _Digest | None = None) -> httpx.Response:
    """`fn()`, tried again after transport errors, 5xx and 429, with backoff;
    a try that moved the download forward resets the count."""
    failures, last_bytes = 0, progress.num_bytes if progress else 0
    while True:
        try:
            return fn()  # type: ignore[return-value]
        except (httpx.TransportError, _Retryable) as exc:
            if progress is not None and progress.num_bytes > last_bytes:
                failures, last_bytes = 0, progress.num_bytes
            if failures >= len(RETRY_BACKOFF_S):
                raise PullError(f"downloading {what} failed after {failures + 1} tries: {exc}") from None
            log.warning(
                "downloading %s: %s; retrying in %.1f s", what, exc or type(exc).__name__, RETRY_BACKOFF_S[failures]
            )
            time.sleep(RETRY_BACKOFF_S[failures])
            failures += 1


def _check_status(response: httpx.Response, url: str) -> None:
    status = response.status_code
    if status < 400:
        return
    if status in (429,) or status >= 500:
        raise _Retryable(f"HTTP {status} from {url}")
    if status in (401, 403):
        raise PullError(
            f"the hub refused {url} (HTTP {status}): the repository may be gated or private; "
            "accept its terms on the hub and set HF_TOKEN"
        )
    if status == 404:
        raise PullError(f"not found on the hub: {url} (HTTP 404); check the repository, revision and file name")
    raise PullError(f"the hub answered HTTP {status} for {url}")


def _normalize_etag(etag: str) -> str:
    return etag.strip().removeprefix("W/").strip('"').lower()


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


# ---- digests and progress --------------------------------------------------------------


class _Digest:
    """sha256 (always) and git blob sha1 (when the hub gave one) of the bytes so far."""

    def __init__(self, remote: RemoteFile) -> None:
        self.remote = remote
        self.restart(None)

    def restart(self, out: BinaryIO | None) -> None:
        if out is not None:
            out.seek(0)
            out.truncate()
        self.num_bytes = 0
        self.sha256 = hashlib.sha256()
        self.git_sha1 = None
        if self.remote.git_sha1 and self.remote.size is not None:
            self.git_sha1 = hashlib.sha1(f"blob {self.remote.size}\0".encode(), usedforsecurity=False)

    def resume(self, out: BinaryIO, size: int | None) -> None:
        """Hash what is already in `out` (a `.partial` left by an earlier try, or a finished file)."""
        out.seek(0, os.SEEK_END)
        if size is not None and out.tell() > size:
            self.restart(out)
            return
        out.seek(0)
        while chunk := out.read(CHUNK_BYTES):
            self.update(chunk)

    def update(self, chunk: bytes) -> None:
        self.num_bytes += len(chunk)
        self.sha256.update(chunk)
        if self.git_sha1 is not None:
            self.git_sha1.update(chunk)

    def mismatch(self, remote: RemoteFile) -> str:
        if remote.size is not None and self.num_bytes != remote.size:
            return f"size {self.num_bytes} bytes, expected {remote.size}"
        if remote.sha256 and self.sha256.hexdigest() != remote.sha256:
            return f"sha256 {self.sha256.hexdigest()}, expected {remote.sha256}"
        if remote.git_sha1 and self.git_sha1 is not None and self.git_sha1.hexdigest() != remote.git_sha1:
            return f"git sha1 {self.git_sha1.hexdigest()}, expected {remote.git_sha1}"
        return ""


class _Meter:
    """Rate (over the last few seconds) and ETA of one file, reported at most
    every PROGRESS_INTERVAL_S."""

    WINDOW_S = 5.0

    def __init__(self, model_id: str, remote: RemoteFile, index: int, num_files: int, report: ProgressCallback) -> None:
        self.model_id, self.remote, self.index, self.num_files, self.report = model_id, remote, index, num_files, report
        self.samples: deque[tuple[float, int]] = deque()
        self.last_report = 0.0

    def start(self, completed: int) -> None:
        self.samples.clear()
        self.samples.append((time.monotonic(), completed))
        self._emit("downloading", completed, 0.0)

    def update(self, completed: int) -> None:
        now = time.monotonic()
        self.samples.append((now, completed))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.WINDOW_S:
            self.samples.popleft()
        if now - self.last_report >= PROGRESS_INTERVAL_S or completed == self.remote.size:
            then, then_bytes = self.samples[0]
            rate = (completed - then_bytes) / (now - then) if now > then else 0.0
            self._emit("downloading", completed, rate)

    def verifying(self) -> None:
        self._emit("verifying", self.samples[-1][1] if self.samples else 0, 0.0)

    def _emit(self, status: str, completed: int, rate: float) -> None:
        self.last_report = time.monotonic()
        total = self.remote.size or 0
        eta = (total - completed) / rate if rate > 0 and total else None
        self.report(
            PullProgress(
                self.model_id, status, self.remote.name, completed, total, rate, eta, self.index, self.num_files
            )
        )
