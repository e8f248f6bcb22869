"""Server settings: one dataclass, filled from CLI flags and `LOCALSERVE_*`
environment variables (flags win)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_PORT = 8400
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"  # where the client commands (list, top, bench) look
#: What a model gets when neither the request, the flags, the user's config file
#: nor the catalog says otherwise (models/options.py applies them in that order).
MODEL_DEFAULTS: dict[str, int | str] = {
    "ctx_size": 4096,
    "parallel": 8,
    "kv_size": 0,
    "device": "auto",
    "n_gpu_layers": "auto",
    "cache_type_k": "f16",
    "cache_type_v": "f16",
    "flash_attn": "auto",
}


@dataclass(slots=True)
class ServerSettings:
    host: str = "127.0.0.1"  # one address, or several comma-separated (`hosts`)
    port: int = DEFAULT_PORT
    models: list[str] = field(default_factory=lambda: [DEFAULT_MODEL])  # ID, PATH or ID=PATH
    api_key: str | None = None
    max_queue: int = 256  # waiting requests per model before 503
    # Per-model options: None = not given here, so the model's own (user config
    # file entry, else catalog entry, else MODEL_DEFAULTS) apply; see models/options.py.
    parallel: int | None = None  # sequences decoded together per model
    ctx_size: int | None = None  # longest sequence per slot; 0 = the model's training context (fit to memory)
    kv_size: int | None = None  # KV cells per model (0: ctx_size * parallel, a stream per slot; fewer: one shared pool)
    device: str | None = None  # a device name (backends/device_names.py); None: each model's own
    n_gpu_layers: int | str | None = None  # layers offloaded to the GPU: "auto" (what fits), N, or -1 (all)
    cache_type_k: str | None = None  # KV cache element type of K: f16, q8_0, q4_0, ... (backends/kv_types.py)
    cache_type_v: str | None = None  # ... of V (quantized V needs flash attention)
    flash_attn: str | None = None  # auto | on | off
    batch_tokens: int = 512  # token budget of one step
    # CPU threads per model: -1 (auto) all cores, fewer while other programs take CPU (engine/threads.py);
    # 0 all cores, fixed; N: N, fixed
    threads: int = -1
    allow_hosts: list[str] = field(default_factory=list)  # extra Host header names
    cors_origins: list[str] = field(default_factory=list)  # extra allowed origins
    max_body_bytes: int = 32 * 1024 * 1024
    body_timeout_s: float = 30.0  # a request body that sends nothing for this long gets 408; 0 = no limit
    aging_s: float = 30.0
    reserved_slots: int = -1  # slots of each model that are interactive work's first claim; -1: parallel // 8
    # Batch work beside other requests (engine/step/batch_policy.py): it joins a step only while the step's
    # predicted time keeps their inter-token latency within this x of the step without it ...
    batch_itl_target: float = 1.2
    batch_ttft_target: float = 1.5  # ... and an arriving prompt's first token within this x its time when idle
    speculative: str = (
        "ngram"  # off | ngram (prompt lookup, the default) | draft (--draft-model): engine/step/speculation.py
    )
    draft_model: str = ""  # a smaller GGUF of the chat models' vocabulary that drafts tokens
    draft_max: int = 8  # drafted tokens one sequence may verify in a step
    # A reasoning model's think section by default (llama-server's --reasoning): on/auto render the template
    # with enable_thinking=true; off closes the section in every prompt that does not ask for thinking itself
    reasoning: str = "auto"
    reasoning_budget: int = -1  # a reasoning model's thinking tokens before </think> is forced; -1: no limit, 0: none
    prefix_cache_disk: int = -1  # bytes of KV state of prompt prefixes kept on disk; -1: a share of free disk, 0: off
    shutdown_timeout_s: float = 10.0
    no_ui: bool = False  # True: no browser UI at / (api/webui.py)
    max_audio_bytes: int = 25 * 1024 * 1024  # larger audio uploads get 413 (OpenAI's limit)
    max_audio_seconds: float = 3600.0  # longer audio gets 400
    data_dir: str = ""  # batch files and job state; "" = data_home()
    batch_max_lines: int = 50_000  # requests in one batch input file (OpenAI's limit)
    batch_max_file_bytes: int = 200 * 1024 * 1024  # largest uploaded file (OpenAI's limit)
    batch_concurrency: int = 0  # batch requests in flight per model; 0 = the model's slots
    batch_disk_timeout_s: float = 3600.0  # a batch paused this long on a full or read-only disk fails, saying why
    max_loaded_models: str = "3"  # per kind: "N", or "chat=N,embeddings=N,asr=N"; 0 = no limit (models/policy.py)
    # llama-server's drop-in (api/llamacpp/): a request with no model, or one this server does not
    # serve, goes to the only model of its kind; strict: 400 / 404 as before (models/registry/naming.py)
    strict_model_names: bool = False
    n_predict: int = -1  # tokens /completion generates when the request sets no n_predict; -1: until the context ends
    temp: float = 0.8  # /completion and /infill's temperature when the request sets none (llama-server's --temp)
    seed: int = -1  # ... and their seed (llama-server's --seed); -1: random
    chat_template_file: str = ""  # a Jinja chat template every chat model uses instead of its own
    chat_template: str = ""  # ... or a built-in name (chatml, llama3, command-r, ...) or Jinja text (the file wins)
    no_slots: bool = False  # GET /slots answers 501 (llama-server's --no-slots)
    no_metrics: bool = False  # GET /metrics answers 501 (llama-server without --metrics)
    verbose: bool = False  # chat answers carry llama-server's `__verbose` unless a request says `verbose: false`
    slot_save_path: str = ""  # where /slots/{id}?action=save|restore keeps prompt caches; "": those actions are 501
    # Embeddings models' pooling (llama-server's --pooling): "" each model's own; mean, cls, last or none load them
    # on llama.cpp with that pooling; none gives one vector per token, which only /embedding(s) return
    pooling: str = ""
    keep_alive: str = ""  # idle time before unloading ("5m", "30s", 0, -1); "" = 5m on demand, start-up models stay

    @property
    def hosts(self) -> list[str]:
        """The addresses to listen on: `host`, or several comma-separated
        (`127.0.0.1,::1`, as llama-server's --host); IPv6 without brackets."""
        return [h.strip().strip("[]") for h in self.host.split(",") if h.strip()] or [""]

    @property
    def cpu_threads(self) -> int:
        """The thread count a backend opens with: 0 = all cores."""
        return max(0, self.threads)

    @property
    def adaptive_threads(self) -> bool:
        """`--threads auto`: the engine chooses each step's count."""
        return self.threads < 0

    def data_path(self) -> Path:
        """`data_dir` if set, else `data_home()`."""
        return Path(self.data_dir).expanduser() if self.data_dir else data_home()


def data_home() -> Path:
    """Where localserve keeps its data (models, batch files, job state):
    `$LOCALSERVE_HOME`, else the platform's user data directory
    (e.g. ~/.local/share/localserve)."""
    home = os.environ.get("LOCALSERVE_HOME", "").strip()
    if home:
        return Path(home).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("localserve", appauthor=False))
