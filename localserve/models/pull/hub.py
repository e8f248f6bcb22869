"""Pull a model from the Hugging Face Hub (or a mirror) into the shared
Hugging Face cache, through huggingface_hub.

What can be pulled: a catalog id (its `hf://` source), `org/repo[:QUANT]`
(`hf.co/org/repo:QUANT` too, as Ollama names it; the GGUF of that
quantization, Q4_K_M or the first one without a tag, every part of a split
model; a repository without GGUF files whole), or `hf://org/repo[@REV]/FILE`.

The files come down with `hf_hub_download` (resumable: an interrupted pull
leaves huggingface_hub's `.incomplete` file and the next one continues it),
then each is checked against the digest the hub lists for it (sha256 of an
LFS file, git blob sha1 of a small one) and the catalog's pins; a file that
does not match is deleted. The environment is read at each call, not at
import: HF_ENDPOINT (a mirror), HF_TOKEN (gated and private repositories),
HF_HUB_OFFLINE (no network: only what is cached), HF_HOME / HF_HUB_CACHE (where).
Blocking code: the server runs it in a thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localserve.disk import check_room, is_storage_error, storage_error, storage_guard
from localserve.errors import ChecksumMismatchError, InvalidRequestError, ModelNotFoundError, PullError
from localserve.models.catalog import CatalogEntry, HubSource, hub_files, load_catalog, parse_hub_uri
from localserve.models.names import gguf_models, pick_gguf, split_tag, validate_model_id
from localserve.models.pull.errors import hub_error
from localserve.models.pull.progress import (
    Meter,
    ProgressCallback,
    PullCancelled,
    PullProgress,
    bound_progress,
    takes_tqdm_class,
    thread_progress,
)
from localserve.models.store import hf_cache
from localserve.models.store.sources import hub_path, locate_entry

__all__ = ["PullCancelled", "PullProgress", "PullResult", "plan_pull", "pull"]

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
METADATA_TIMEOUT_S = 10.0
MAX_TRIES = 5  # per file, each after a try that brought bytes
_HEX64, _HEX40 = re.compile(r"[0-9a-f]{64}"), re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, slots=True)
class PullPlan:
    """What to fetch: files of one repository (none named: chosen by `tag`)."""

    model_id: str  # the name it is served under once here
    repo: str
    revision: str = "main"
    files: tuple[str, ...] = ()  # () = the GGUF of `tag`, else the whole repository
    tag: str = ""
    sha256: Mapping[str, str] = field(default_factory=dict)  # the catalog's pins
    entry: CatalogEntry | None = None


@dataclass(frozen=True, slots=True)
class PullResult:
    model_id: str
    path: Path  # what a backend loads
    size_bytes: int
    source: str  # hf://org/repo
    existed: bool  # nothing was downloaded


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_ENDPOINT


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN", "").strip() or None  # None: huggingface_hub's saved login


# ---- what to pull ------------------------------------------------------------------------


def plan_pull(ref: str, *, catalog: Mapping[str, CatalogEntry] | None = None) -> PullPlan:
    """A catalog id, `org/repo[:QUANT]`, `hf.co/org/repo[:QUANT]` or `hf://org/repo[@REV]/FILE`."""
    if ref.startswith("hf://"):
        hub = parse_hub_uri(ref)
        return PullPlan(f"{hub.repo}:{_tag_of(hub.main)}", hub.repo, hub.revision, hub_files(hub), sha256=hub.sha256)
    name = re.sub(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/", "", ref)
    validate_model_id(name)
    catalog = load_catalog() if catalog is None else catalog
    entry = catalog.get(name)
    if entry is not None:
        source = entry.hub_source()
        if source is None:
            hints = "; ".join(s.install for s in entry.sources if s.install) or "it has no hub source"
            raise InvalidRequestError(f"model {name!r} is not on a model hub: {hints}", param="model")
        return PullPlan(name, source.repo, source.revision, hub_files(source), sha256=source.sha256, entry=entry)
    repo, tag = split_tag(name)
    if repo.count("/") != 1:
        raise ModelNotFoundError(
            f"unknown model {ref!r}: pull a catalog id (see `localserve list`), org/repo[:QUANT] or "
            "hf://ORG/REPO/FILE from the Hugging Face Hub (this server does not pull from Ollama's registry)",
            param="model",
        )
    return PullPlan(name, repo, tag=tag)


def _tag_of(file_name: str) -> str:
    return gguf_models([file_name])[0].tag if file_name.lower().endswith(".gguf") else ""


# ---- the pull ----------------------------------------------------------------------------


def pull(
    plan: PullPlan,
    *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    force: bool = False,
) -> PullResult:
    """Download what `plan` names into the Hugging Face cache, verified."""
    report = progress or (lambda _: None)
    present = None if force else already_here(plan)
    if present is not None:
        report(PullProgress(present.model_id, "exists", total=present.size_bytes, completed=present.size_bytes))
        return present
    if is_offline():
        raise PullError(
            f"cannot pull {plan.model_id!r}: HF_HUB_OFFLINE is set and it is not in the Hugging Face cache "
            f"({hf_cache.hub_cache_dir()}); unset HF_HUB_OFFLINE to download it"
        )
    report(PullProgress(plan.model_id, "resolving"))
    listing = _list_files(plan)
    names = _choose(plan, listing)
    _check_disk_space(sum(int(listing[n].get("size") or 0) for n in names))
    for name in names:
        pinned, listed = plan.sha256.get(name), listing[name].get("sha256")
        if pinned and listed and pinned != listed:
            raise ChecksumMismatchError(
                f"{plan.repo}/{name}: the catalog pins sha256 {pinned} but the hub lists {listed}; not downloading"
            )
    for index, name in enumerate(names):
        expected = listing[name]
        base = PullProgress(
            plan.model_id, "downloading", name, 0, int(expected.get("size") or 0), 0.0, None, index, len(names),
            str(expected.get("sha256") or ""),
        )  # fmt: skip
        meter = Meter(report, base, cancel)
        path = _download(plan, name, meter)
        meter.status("verifying")
        _verify(plan.repo, path, name, expected, plan.sha256.get(name))
    result = already_here(plan)
    if result is None:
        raise PullError(f"pulled {plan.model_id!r} but cannot find it in {hf_cache.hub_cache_dir()}")
    result = PullResult(result.model_id, result.path, result.size_bytes, result.source, existed=False)
    report(PullProgress(result.model_id, "success", total=result.size_bytes, completed=result.size_bytes))
    return result


def already_here(plan: PullPlan) -> PullResult | None:
    """The model, if it is on this machine (a catalog model from any of its sources)."""
    source = f"hf://{plan.repo}"
    if plan.entry is not None:
        try:
            path, origin = locate_entry(plan.entry)
        except ModelNotFoundError:
            return None
        return PullResult(plan.model_id, path, _size(path), origin if origin != "huggingface" else source, True)
    if plan.files:
        cached = hub_path(HubSource(plan.repo, plan.revision, plan.files, plan.files[0], plan.sha256))
        return None if cached is None else PullResult(plan.model_id, cached, _size(cached), source, True)
    local = hf_cache.find(plan.model_id)
    return None if local is None else PullResult(local.name, local.path, local.size_bytes, source, True)


def _size(path: Path) -> int:
    from localserve.models.store.local import disk_size, folder_files

    return disk_size(folder_files(path) if path.is_dir() else [path])


def _list_files(plan: PullPlan) -> dict[str, dict[str, Any]]:
    """name -> {size, sha256, git_sha1} of every file of the repository at the revision."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint(), token=_token())
    try:
        info = api.model_info(plan.repo, revision=plan.revision, files_metadata=True, timeout=METADATA_TIMEOUT_S)
    except Exception as exc:
        raise hub_error(exc, plan.repo, hub_endpoint()) from None
    out = {}
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        sha256 = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        out[sibling.rfilename] = {"size": sibling.size, "sha256": sha256, "git_sha1": sibling.blob_id}
    return out


def _choose(plan: PullPlan, listing: dict[str, dict[str, Any]]) -> list[str]:
    """The files to fetch: the plan's, else the GGUF of its tag, else every file."""
    if plan.files:
        missing = [name for name in plan.files if name not in listing]
        if missing:
            raise PullError(f"not found in {plan.repo} on the hub at {hub_endpoint()}: {', '.join(missing)}")
        return list(plan.files)
    ggufs = gguf_models(list(listing))
    if ggufs:
        chosen = pick_gguf(ggufs, plan.tag)
        if chosen is None:
            tags = ", ".join(g.tag for g in ggufs)
            raise PullError(f"{plan.repo} has no GGUF file for {plan.tag!r} (it has: {tags})")
        return list(chosen.parts)
    if plan.tag:
        raise PullError(f"{plan.repo} has no GGUF files, so no quantization {plan.tag!r}; pull {plan.repo}")
    return sorted(listing)


def _check_disk_space(needed: int) -> None:
    cache = hf_cache.hub_cache_dir()
    with storage_guard(cache, "making the Hugging Face cache"):
        cache.mkdir(parents=True, exist_ok=True)
    check_room(cache, needed, "this pull")


def _disk_failure(exc: BaseException) -> BaseException | None:
    """The full or read-only disk behind `exc` (huggingface_hub wraps it), if that is what failed."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if is_storage_error(cause):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _remove_partials(repo: str) -> None:
    """huggingface_hub's `.incomplete` downloads of `repo`: a pull stopped by a
    full disk leaves none behind (a dropped connection keeps them, to resume)."""
    for partial in (hf_cache.repo_folder(repo) / "blobs").glob("*.incomplete"):
        partial.unlink(missing_ok=True)


def _download(plan: PullPlan, name: str, meter: Meter) -> Path:
    """One file into the cache; its snapshot path. A connection that drops
    after bytes arrived is tried again from where it stopped (huggingface_hub
    resumes its `.incomplete` file); one that brings nothing fails at once."""
    from huggingface_hub import hf_hub_download

    bar = bound_progress(meter)
    kwargs: dict[str, Any] = dict(
        revision=plan.revision, cache_dir=hf_cache.hub_cache_dir(), endpoint=hub_endpoint(), token=_token()
    )
    for attempt in range(MAX_TRIES):
        before = meter.completed
        try:
            if takes_tqdm_class():
                return Path(hf_hub_download(plan.repo, name, **{**kwargs, "tqdm_class": bar}))
            with thread_progress(bar):
                return Path(hf_hub_download(plan.repo, name, **kwargs))
        except PullCancelled:
            raise
        except Exception as exc:
            full = _disk_failure(exc)
            if full is not None:
                _remove_partials(plan.repo)
                what = f"pulling {plan.repo}/{name}"
                raise storage_error(full, hf_cache.hub_cache_dir(), what, needed=meter.base.total or None) from None
            error = hub_error(exc, f"{plan.repo}/{name}", hub_endpoint())
            if meter.completed <= before or attempt == MAX_TRIES - 1 or _is_http_error(exc):
                raise error from None
            log.warning("downloading %s/%s: %s; resuming", plan.repo, name, exc)
    raise AssertionError("unreachable")


def _is_http_error(exc: Exception) -> bool:
    from huggingface_hub.errors import HfHubHTTPError

    return isinstance(exc, HfHubHTTPError)


def _verify(repo: str, path: Path, name: str, expected: dict[str, Any], pinned: str | None) -> None:
    """The file's digest against the hub's listing, its blob name and the catalog's pin; delete it if one differs."""
    blob = Path(os.path.realpath(path))
    sha256, git_sha1 = hashlib.sha256(), hashlib.sha1(usedforsecurity=False)
    git_sha1.update(f"blob {blob.stat().st_size}\0".encode())
    with blob.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha256.update(chunk)
            git_sha1.update(chunk)
    wants = [expected.get("sha256"), pinned, blob.name if _HEX64.fullmatch(blob.name) else None]
    problem = next((f"sha256 {sha256.hexdigest()}, expected {w}" for w in wants if w and w != sha256.hexdigest()), "")
    if not problem and not expected.get("sha256") and not pinned:
        want = expected.get("git_sha1") or (blob.name if _HEX40.fullmatch(blob.name) else None)
        if want and want != git_sha1.hexdigest():
            problem = f"git sha1 {git_sha1.hexdigest()}, expected {want}"
    if problem:
        from localserve.models.store.hf_remove import delete_links

        delete_links(hf_cache.repo_folder(repo), [path])
        raise ChecksumMismatchError(f"{name}: {problem}; the download was deleted")
