"""`localserve batch run --ray`: a batch input file answered by a pool of
engine replicas on a Ray cluster, through Ray Data.

The driver (this process) does what the single-machine run does around the
work (`offline.process_file`): it reads INPUT through fsspec (a local path
or `s3://`, `gs://`, `az://`), validates it whole, skips the custom_ids
already in OUTPUT or in its local journal, and at the end publishes OUTPUT
(earlier lines, then new ones in input order) and the errors file in the
Batch API line formats, each in one atomic write. In between:

* the pending lines go into Ray's object store as `{"custom_id", "body"}`
  rows, `ROWS_PER_PUT` at a time (the driver never holds all the bodies);
* `map_batches` sends batches of them to a fixed pool of `EngineReplica`
  actors, one engine each (see `ray_replica`), spread over the nodes;
* answers stream back as each batch ends and are appended to the journal
  (each line flushed), so an interrupted job loses only the batches in
  flight, and a rerun computes only what is missing.

Ray is imported only here, and only when `--ray` is given.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localserve.errors import LocalServeError
from localserve.jobs.offline import Journal, ModelOpener, Summary, process_file
from localserve.jobs.ray_progress import ReplicaProgress
from localserve.jobs.ray_replica import RESULT_COLUMNS, EngineReplica
from localserve.jobs.types import LineRef
from localserve.jobs.validate import Limits, Validation, read_bodies

log = logging.getLogger(__name__)

ROWS_PER_PUT = 10_000
#: Larger than the Batch API's limits (50k lines, 200 MB): a cluster job is
#: bounded by the driver's memory for the line index (~150 bytes a line).
RAY_LIMITS = Limits(max_lines=10_000_000, max_bytes=64 * 1024**3, max_embedding_inputs=10_000_000)
REPLICA_START_TIMEOUT_S = 1800  # a model copied from object storage onto a new node may take minutes
CALLS_PER_REPLICA = 2  # Ray batches in flight on one actor: the next fills the slots the last one's tail leaves


@dataclass(frozen=True, slots=True)
class RayOptions:
    address: str | None = None  # None: $RAY_ADDRESS, else a new local Ray instance
    replicas: int = 0  # 0: one per node of the cluster
    batch_size: int = 8  # lines per Ray batch; a replica submits them all to its engine at once
    num_cpus: float = 0  # CPUs each replica reserves (its engine's threads); 0: a whole node's


class RayUnavailableError(LocalServeError):
    """`--ray` without the `ray` extra installed."""


class ReplicaError(LocalServeError):
    """A replica or Ray itself failed; the message ends with the replica's error."""


async def run_file_on_ray(
    input_url: str,
    output_url: str,
    open_model: ModelOpener,
    options: RayOptions,
    *,
    work_dir: Path,
    endpoint: str | None = None,
    model: str | None = None,
    progress: ReplicaProgress | None = None,
) -> Summary:
    """Run every request of `input_url` not yet answered on Ray; see the module docstring.
    `open_model` must pickle: each replica calls it on its own node."""

    async def run_on_ray(validation: Validation, input_path: Path, pending: list[LineRef], journal: Journal) -> None:
        assert validation.endpoint is not None and validation.model is not None  # a valid file has both
        # Synchronous on purpose: nothing else runs on this loop, and Ray wants
        # its driver (ray.init, Ctrl-C) on the main thread.
        _run_pending(
            open_model,
            options,
            model or validation.model,
            validation.endpoint,
            input_path,
            pending,
            journal,
            progress,
            len(validation.lines),
        )

    return await process_file(
        input_url, output_url, run_on_ray, work_dir=work_dir, endpoint=endpoint, limits=RAY_LIMITS
    )


def import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise RayUnavailableError(
            "`--ray` needs Ray Data: pip install 'localserve[ray]' (or pip install 'ray[data]')"
        ) from None
    return ray


def _run_pending(
    open_model: ModelOpener,
    options: RayOptions,
    model: str,
    endpoint: str,
    input_path: Path,
    pending: list[LineRef],
    journal: Journal,
    progress: ReplicaProgress | None,
    num_total: int,
) -> None:
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:  # else a caller (a test, a notebook) is connected already
        ray.init(address=options.address or None)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours is below
    # Start every replica (each loads its model) before any line is sent: else the
    # first one up takes the work of a small job, and a cluster too small for the
    # replicas fails with a clear timeout instead of waiting forever.
    context.wait_for_min_actors_s = REPLICA_START_TIMEOUT_S
    try:
        num_replicas, num_cpus = _pool_size(ray, options)
        results = _dataset(ray, input_path, pending).map_batches(
            EngineReplica,
            fn_constructor_args=(open_model, model, endpoint),
            batch_size=options.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(
                size=num_replicas,
                max_concurrent_calls_per_actor=CALLS_PER_REPLICA,
                max_tasks_in_flight_per_actor=CALLS_PER_REPLICA,  # no queue of batches behind a busy replica
                enable_true_multi_threading=True,
            ),
            num_cpus=num_cpus,
        )
        if progress is not None:
            progress.start(num_total, num_total - len(pending))
        _collect(results, journal, progress)
    except ray.exceptions.RayError as exc:  # e.g. a replica could not load the model on its node
        cause = [line for line in str(exc).splitlines() if line.strip()][-1:] or [type(exc).__name__]
        raise ReplicaError(f"the Ray job failed; answers so far are kept for a rerun: {cause[0].strip()}") from exc
    finally:
        if started_here:
            ray.shutdown()


def _pool_size(ray: Any, options: RayOptions) -> tuple[int, float]:
    """Replicas, and the CPUs each reserves (a whole node's for `--threads 0`)."""
    node_cpus = [node["Resources"]["CPU"] for node in ray.nodes() if node.get("Alive") and node["Resources"].get("CPU")]
    num_replicas = options.replicas or len(node_cpus)
    num_cpus = options.num_cpus or min(node_cpus)  # an engine on all cores: one per node
    if num_replicas * num_cpus > sum(node_cpus):
        log.warning(
            "%d replicas of %g CPUs each do not fit the cluster's %g CPUs: they start only if it grows",
            num_replicas, num_cpus, sum(node_cpus),
        )  # fmt: skip
    return num_replicas, num_cpus


def _collect(results: Any, journal: Journal, progress: ReplicaProgress | None) -> None:
    """Journal each answer as its Ray batch comes back (in whatever order batches end)."""
    for batch in results.iter_batches(batch_size=None, batch_format="numpy"):
        for custom_id, line, ok, num_tokens, replica, since in zip(*(batch[c] for c in RESULT_COLUMNS), strict=True):
            journal.add(str(custom_id), str(line), ok=bool(ok))
            if progress is not None:
                progress.advance_replica(str(replica), float(since), ok=bool(ok), num_tokens=int(num_tokens))
    if progress is not None:
        progress.finish()
        for row in progress.summary():
            print(f"  {row}", file=progress.stream)


def _dataset(ray: Any, input_path: Path, pending: list[LineRef]) -> Any:
    """The pending lines as `{"custom_id", "body"}` rows in Ray's object store."""
    parts = []
    for start in range(0, len(pending), ROWS_PER_PUT):
        refs = pending[start : start + ROWS_PER_PUT]
        bodies = read_bodies(input_path, refs)
        rows = [
            {"custom_id": r.custom_id, "body": json.dumps(b, ensure_ascii=False)}
            for r, b in zip(refs, bodies, strict=True)
        ]
        parts.append(ray.data.from_items(rows))
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
