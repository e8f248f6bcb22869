"""Export a decoder-only LLM once to the formats of the ONNX Runtime and
OpenVINO backends, into the model store.

The source is a GGUF (dequantized to float32 by transformers' GGUF loader) or
a Hugging Face model folder. The tokenizer of a GGUF is rebuilt here from the
GGUF's own vocabulary, merges and special-token ids (transformers' conversion
gets SmolLM2's BOS/EOS wrong). Then:

* onnx: optimum-onnx's exporter (`text-generation-with-past`): one
  `model.onnx` with `past_key_values.*` inputs and `present.*` outputs;
* openvino: optimum-intel's exporter with `stateful=False`: the same inputs
  and outputs, in IR traced from PyTorch (about 1.6x faster for one sequence
  on the CPU than the ONNX graph converted by `openvino.convert_model`:
  OpenVINO's PyTorch frontend keeps attention as one fused operation).

Each output is a folder with the graph, `config.json` and the tokenizer
files, renamed into place only when complete. Exporting needs the `convert`
extra (torch, transformers, optimum-onnx, optimum-intel, openvino); serving
needs none of it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from localserve.disk import storage_guard
from localserve.errors import InvalidRequestError, LocalServeError
from localserve.models.convert.fingerprint import content_fingerprint
from localserve.models.convert.supersede import remove_superseded

#: format -> (our exporter's version, the packages whose versions key the cache)
EXPORTERS = {
    "onnx": (1, ("torch", "transformers", "optimum-onnx")),
    "openvino": (1, ("torch", "transformers", "optimum-intel", "openvino")),
}
FORMATS = ("onnx", "openvino")
PRECISIONS = ("fp32", "fp16")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "config.json",
)
#: progress(stage, done, total): `done` of `total` stages finished.
Progress = Callable[[str, int, int], None]

# GGUF `tokenizer.ggml.pre` -> how the text is split before BPE (llama.cpp's
# llama-vocab.cpp has the same table as regular expressions).
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZERS = {
    "default": [],
    "gpt2": [],
    "smollm": ["digits"],
    "llama-bpe": [_LLAMA3_SPLIT],
    "llama3": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
}


def export_model(
    source: Path,
    name: str,
    formats: tuple[str, ...] = FORMATS,
    *,
    precision: str = "fp32",
    store: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> dict[str, Path]:
    """The exported folder of each of `formats`, exported now unless the store
    has an up-to-date copy (keyed by the source file and the exporter)."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or precision not in PRECISIONS:
        raise InvalidRequestError(f"export to {', '.join(FORMATS)} with precision {', '.join(PRECISIONS)}")
    if precision == "fp16" and "onnx" in formats:
        raise InvalidRequestError("fp16 export is for OpenVINO only here; export ONNX as fp32")
    if store is None:
        from localserve.models.convert.cache import model_store

        store = model_store()

    targets = {f: store / name / f"{name}-{_digest(source, f, precision)}-{f}-{precision}" for f in formats}
    todo = [f for f, t in targets.items() if force or not (t / ".complete").is_file()]
    if not todo:
        return targets
    report = _Stages(["tokenizer", "weights", *todo], progress)
    # A full disk: the temporary folder goes, and the error says how much was free.
    with storage_guard(store, f"exporting {name}"):
        store.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{name}-export-", dir=store) as tmp:
            work = Path(tmp)
            hf_dir = _hf_folder(source, work / "hf", report)
            if "onnx" in todo:
                report("onnx")
                _export_onnx(hf_dir, work / "onnx")
            if "openvino" in todo:
                report("openvino")
                _export_openvino(hf_dir, work / "openvino", precision)
            for fmt in todo:
                _install(work / fmt, targets[fmt])
    for fmt in todo:
        remove_superseded(targets[fmt])
    report("done")
    return targets


class _Stages:
    def __init__(self, stages: list[str], progress: Progress | None) -> None:
        self.stages = stages
        self.progress = progress

    def __call__(self, stage: str) -> None:
        if self.progress is not None:
            done = self.stages.index(stage) if stage in self.stages else len(self.stages)
            self.progress(stage, done, len(self.stages))


def _digest(source: Path, fmt: str, precision: str) -> str:
    files = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.is_file())
    parts = [content_fingerprint(p) for p in files]
    version, packages = EXPORTERS.get(fmt, (1, ("torch", "transformers")))
    key = "|".join([*parts, fmt, precision, f"v{version}", *(f"{p}={_version(p)}" for p in packages)])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _install(built: Path, target: Path) -> None:
    """Move a finished export into place (replacing an old one) and mark it complete."""
    (built / ".complete").write_text("ok\n", encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(built), str(target))


def _hf_folder(source: Path, out: Path, report: _Stages) -> Path:
    """A Hugging Face folder for the exporter: the source folder itself, or
    the GGUF's weights (dequantized) and tokenizer written to `out`."""
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise InvalidRequestError(f"{source} is not a Hugging Face model folder (config.json is missing)")
        return source
    if source.suffix.lower() != ".gguf":
        raise InvalidRequestError(f"{source}: export needs a .gguf file or a Hugging Face model folder")
    report("tokenizer")
    out.mkdir(parents=True)
    from gguf import GGUFReader

    write_gguf_tokenizer(GGUFReader(str(source)), out)
    report("weights")
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    generation = out / "generation_config.json"
    ours = json.loads(generation.read_text(encoding="utf-8"))
    model.save_pretrained(str(out))  # rewrites generation_config.json: keep the GGUF's BOS/EOS ids
    _write_json(generation, {**json.loads(generation.read_text(encoding="utf-8")), **ours})
    return out


def _export_onnx(hf_dir: Path, out: Path) -> None:
    from optimum.exporters.onnx import main_export

    main_export(str(hf_dir), str(out), task="text-generation-with-past", do_validation=False)
    _copy_tokenizer(hf_dir, out)
    if not (out / "model.onnx").is_file():
        raise LocalServeError(f"the ONNX exporter wrote no model.onnx into {out}")


def _export_openvino(hf_dir: Path, out: Path, precision: str) -> None:
    from optimum.intel import OVModelForCausalLM

    # stateful=False: past KV as inputs/outputs, which our scheduler needs
    # (a stateful model keeps one hidden KV per infer request).
    model = OVModelForCausalLM.from_pretrained(
        str(hf_dir), export=True, stateful=False, compile=False, load_in_8bit=False
    )
    model.save_pretrained(str(out))
    if precision == "fp16":
        import openvino as ov

        xml = out / "openvino_model.xml"
        ov.save_model(ov.Core().read_model(str(xml)), str(out / "fp16.xml"), compress_to_fp16=True)
        (out / "fp16.xml").replace(xml)
        (out / "fp16.bin").replace(out / "openvino_model.bin")
    _copy_tokenizer(hf_dir, out)


def _copy_tokenizer(src: Path, dst: Path) -> None:
    """The source's tokenizer files win over what an exporter rewrote."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and (name != "config.json" or not (dst / name).exists()):
            shutil.copyfile(src / name, dst / name)


# ---- the tokenizer of a GGUF ------------------------------------------------


def write_gguf_tokenizer(reader: Any, out: Path) -> None:
    """tokenizer.json, tokenizer_config.json and generation_config.json from
    a GGUF's `tokenizer.ggml.*` metadata (byte-level BPE vocabularies)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    meta = _GgufMeta(reader)
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise InvalidRequestError(
            f"this GGUF's tokenizer ({kind}, pre-tokenizer {pre!r}) cannot be rebuilt here yet; "
            "export from the model's Hugging Face folder instead"
        )
    tokens: list[str] = meta.get("tokenizer.ggml.tokens")
    types: list[int] = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=False))
    steps: list[Any] = []
    for split in _PRE_TOKENIZERS[pre]:
        if split == "digits":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        else:
            steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
    use_regex = not any(s != "digits" for s in _PRE_TOKENIZERS[pre])
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    # 3: control (special), 4: user-defined (added, kept as text)
    added = [
        AddedToken(t, special=ty == 3, normalized=False) for t, ty in zip(tokens, types, strict=True) if ty in (3, 4)
    ]
    tokenizer.add_tokens(added)
    tokenizer.save(str(out / "tokenizer.json"))

    def token(key: str) -> str | None:
        token_id = meta.get(key)
        return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta.get('general.architecture')}.context_length", 2048)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    _write_json(out / "tokenizer_config.json", {k: v for k, v in config.items() if v is not None})
    eos_ids = [meta.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    generation = {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": sorted({i for i in eos_ids if isinstance(i, int)}),
    }
    _write_json(out / "generation_config.json", generation)


class _GgufMeta:
    """Typed access to a GGUF's metadata fields."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
