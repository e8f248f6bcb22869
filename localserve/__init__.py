"""localserve: a local LLM and speech server."""

import os

# How llama.cpp's threads wait at the barriers of a graph (libgomp, which
# llama.cpp uses when built with OpenMP). It must be set before llama_cpp
# loads libgomp, hence here; OMP_WAIT_POLICY or GOMP_SPINCOUNT set in the
# environment (or LOCALSERVE_THREAD_WAIT) win. A short bounded spin: a thread
# catches the next operation of the graph without a futex wake-up (sleeping at
# once made decoding 2.3x slower at one stream), then sleeps between steps,
# so the event loop and other models keep their cores; libgomp itself spins
# only briefly while it runs more threads than there are cores (chat and a
# GGUF embeddings model together). Measured with bench/thread_policy.py.
THREAD_WAIT_DEFAULT = "spin:30000"


def thread_wait_env(policy: str) -> dict[str, str]:
    """The libgomp variables of a wait policy: `passive` (sleep at once: every
    barrier pays a futex wake-up), `active` (spin for ever), `default`
    (libgomp's own: spin a while, then sleep; much shorter spins when there
    are more threads than cores) or `spin:N` (spin N rounds, then sleep)."""
    policy = policy.strip().lower()
    if policy == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    if policy == "active":
        return {"OMP_WAIT_POLICY": "ACTIVE"}
    if policy == "default":
        return {}
    if policy.startswith("spin:") and policy[5:].isdigit():
        return {"GOMP_SPINCOUNT": policy[5:]}
    raise ValueError(f"unknown thread wait policy {policy!r}: use passive, active, default or spin:N")


if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    try:
        os.environ.update(thread_wait_env(os.environ.get("LOCALSERVE_THREAD_WAIT", THREAD_WAIT_DEFAULT)))
    except ValueError:
        os.environ.update(thread_wait_env(THREAD_WAIT_DEFAULT))

__version__ = "0.1.0"
