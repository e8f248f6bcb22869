"""Convert a model once into the format a run-time backend loads, and cache it
in the model store.

A sentence-transformers BERT folder (safetensors weights, WordPiece vocab,
`1_Pooling/config.json`) becomes a GGUF of llama.cpp's `bert` architecture,
the way llama.cpp's own `convert_hf_to_gguf.py` writes `BertModel`, with
numpy, `safetensors` and `gguf` only: no torch, at conversion or at run time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localserve.disk import check_room, storage_guard
from localserve.errors import InvalidRequestError, LocalServeError
from localserve.models.convert.fingerprint import content_fingerprint
from localserve.models.convert.supersede import remove_superseded

CONVERTER_VERSION = 1
OUT_TYPES = ("f16", "f32")
#: GGUF metadata key that says whether outputs are L2-normalised (a
#: sentence-transformers `Normalize` module); llama.cpp ignores it.
NORMALIZE_KEY = "localserve.embedding.normalize"

#: progress(stage, done, total): stage is a tensor name or "done".
Progress = Callable[[str, int, int], None]


log = logging.getLogger(__name__)

# Kept in float32 whatever the output type, as convert_hf_to_gguf.py does.
_F32_TENSORS = ("position_embd.weight", "token_types.weight")
# Weights llama.cpp does not use for embeddings (BERT's pooler, MLM heads).
_SKIPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
# A sequence classifier's head, as llama.cpp's rank pooling applies it: tanh(cls(x_CLS)), then cls.output.
_CLASSIFIER_HEAD = {
    "pooler.dense.weight": "cls.weight",
    "pooler.dense.bias": "cls.bias",
    "classifier.weight": "cls.output.weight",
    "classifier.bias": "cls.output.bias",
}


def model_store() -> Path:
    """Where converted models live: `$LOCALSERVE_HOME/models`, else the
    platform's user data directory (e.g. ~/.local/share/localserve/models)."""
    home = os.environ.get("LOCALSERVE_HOME", "").strip()
    if home:
        return Path(home).expanduser() / "models"
    from platformdirs import user_data_dir

    return Path(user_data_dir("localserve", appauthor=False)) / "models"


def log_progress(model_id: str, target: str = "GGUF") -> Progress:
    """A `Progress` that logs a conversion of `model_id` to `target` every quarter."""
    last = [-1]

    def progress(stage: str, done: int, total: int) -> None:
        quarter = 4 * done // max(1, total)
        if stage == "done":
            log.info("converted %s to %s", model_id, target)
        elif quarter != last[0]:
            last[0] = quarter
            log.info("converting %s to %s: %d%% (%s)", model_id, target, 100 * done // max(1, total), stage)

    return progress


@dataclass(frozen=True, slots=True)
class SentenceTransformersModel:
    """What the converter reads from a sentence-transformers folder."""

    path: Path
    config: dict[str, Any]
    pooling: str  # "mean" | "cls"
    normalize: bool

    @property
    def weights(self) -> Path:
        return self.path / "model.safetensors"


def read_sentence_transformers(path: Path) -> SentenceTransformersModel:
    """Check that `path` is a BERT sentence-transformers folder we can convert."""
    config_path, weights = path / "config.json", path / "model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise InvalidRequestError(
            f"{path} is not a sentence-transformers folder (needs config.json and model.safetensors)"
        )
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("model_type") != "bert":
        raise InvalidRequestError(
            f"{path}: only BERT models convert to GGUF here; this one is {config.get('model_type')!r}"
        )
    modules = _read_json(path / "modules.json", [])
    pooling, normalize = "mean", False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith(".Pooling"):
            pooling_config = _read_json(path / module.get("path", "") / "config.json", {})
            if pooling_config.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif not pooling_config.get("pooling_mode_mean_tokens", True):
                raise InvalidRequestError(f"{path}: only mean and CLS pooling are supported")
        elif kind.endswith(".Normalize"):
            normalize = True
    return SentenceTransformersModel(path, config, pooling, normalize)


def cached_gguf(
    source: Path, name: str, *, out_type: str = "f32", force: bool = False, progress: Progress | None = None
) -> Path:
    """The GGUF of the sentence-transformers folder `source`, converted now
    if the store has no up-to-date copy (keyed by the source's weights)."""
    model = read_sentence_transformers(source)
    target = store_target(model, name, f"{out_type}.gguf")
    if target.is_file() and not force:
        return target
    return convert_bert_to_gguf(model, target, out_type=out_type, progress=progress)


def store_target(model: SentenceTransformersModel, name: str, suffix: str) -> Path:
    """`<store>/<name>/<name>-<digest>-<suffix>`, the digest keyed by the
    source weights and the converter, so a changed source converts again."""
    fingerprint = f"{content_fingerprint(model.weights)}|{suffix}|v{CONVERTER_VERSION}"
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    folder = name.replace("/", "--").replace(":", "@")  # org/repo:TAG as one folder name
    return model_store() / folder / f"{folder}-{digest}-{suffix}"


def write_atomically(target: Path, write: Callable[[Path], object], *, needed: int | None = None) -> Path:
    """Call `write(tmp)` on a temporary file beside `target`, then rename it
    into place: readers never see a half-written model. A disk that fills
    (or is read-only) leaves no temporary file and raises a 507 naming the
    space `needed` (when known, also checked before writing) and free; once
    written, the conversions `target` supersedes are removed."""
    what = f"writing {target.name}"
    with storage_guard(target.parent, what, needed=needed):
        target.parent.mkdir(parents=True, exist_ok=True)
        if needed is not None:
            check_room(target.parent, needed, what)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            write(tmp)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    remove_superseded(target)
    return target


def convert_bert_to_gguf(
    model: SentenceTransformersModel,
    target: Path,
    *,
    out_type: str = "f32",
    progress: Progress | None = None,
    labels: tuple[str, ...] = (),
) -> Path:
    """Write `model` as a GGUF at `target`, atomically (temp file + rename).
    With `labels`, a sequence classifier: its pooler and classifier layers
    become llama.cpp's `cls` and `cls.output`, pooled with `rank`."""
    import gguf
    from safetensors import safe_open

    if out_type not in OUT_TYPES:
        raise InvalidRequestError(f"unknown output type {out_type!r}; use one of {', '.join(OUT_TYPES)}")
    num_tensors = [0]

    def write(tmp: Path) -> None:
        with safe_open(str(model.weights), framework="numpy") as weights:
            tensors = _plan_tensors(weights, model.config, out_type, classifier=bool(labels))
            writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
            _write_metadata(writer, model, out_type, labels)
            for gguf_name, (_, dtype, shape) in tensors.items():
                nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
                writer.add_tensor_info(gguf_name, shape, np.dtype(dtype), nbytes)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            num_tensors[0] = len(tensors)
            for done, (gguf_name, (hf_name, dtype, _)) in enumerate(tensors.items()):
                if progress is not None:
                    progress(gguf_name, done, len(tensors))
                writer.write_tensor_data(np.ascontiguousarray(weights.get_tensor(hf_name), dtype=dtype))
            writer.close()

    write_atomically(target, write, needed=model.weights.stat().st_size // (2 if out_type == "f16" else 1))
    if progress is not None:
        progress("done", num_tensors[0], num_tensors[0])
    return target


def _plan_tensors(
    weights: Any, config: dict[str, Any], out_type: str, *, classifier: bool = False
) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """GGUF name -> (safetensors name, numpy dtype, shape), in file order.
    Matrices go to `out_type`; vectors and the position/type tables stay f32.
    A `classifier` keeps its head: the pooler as `cls`, the classifier as `cls.output`."""
    import gguf

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, int(config["num_hidden_layers"]))
    planned: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    for hf_name in weights.keys():  # noqa: SIM118 - a safetensors handle, not a dict
        short = hf_name.removeprefix("bert.")
        head = _CLASSIFIER_HEAD.get(short) if classifier else None
        if head is None and (short in _SKIPPED or short.startswith("cls.")):
            continue
        gguf_name = head or name_map.get_name(short, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise LocalServeError(f"cannot map tensor {hf_name!r} of a BERT model to GGUF")
        shape = tuple(int(n) for n in weights.get_slice(hf_name).get_shape())
        half = out_type == "f16" and len(shape) == 2 and gguf_name not in _F32_TENSORS
        planned[gguf_name] = (hf_name, "float16" if half else "float32", shape)
    return planned


def _write_metadata(writer: Any, model: SentenceTransformersModel, out_type: str, labels: tuple[str, ...] = ()) -> None:
    import gguf

    c = model.config
    writer.add_name(model.path.parent.name if model.path.name == "model" else model.path.name)
    writer.add_block_count(int(c["num_hidden_layers"]))
    writer.add_context_length(int(c["max_position_embeddings"]))
    writer.add_embedding_length(int(c["hidden_size"]))
    writer.add_feed_forward_length(int(c["intermediate_size"]))
    writer.add_head_count(int(c["num_attention_heads"]))
    writer.add_layer_norm_eps(float(c.get("layer_norm_eps", 1e-12)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if out_type == "f16" else gguf.LlamaFileType.ALL_F32)
    writer.add_causal_attention(False)
    if labels:
        writer.add_pooling_type(gguf.PoolingType.RANK)
        writer.add_classifier_output_labels(list(labels))
    else:
        writer.add_pooling_type(gguf.PoolingType.CLS if model.pooling == "cls" else gguf.PoolingType.MEAN)
    writer.add_bool(NORMALIZE_KEY, model.normalize)
    _write_vocab(writer, model)


def _write_vocab(writer: Any, model: SentenceTransformersModel) -> None:
    """WordPiece vocab in llama.cpp's "phantom space" form: word starts get
    "▁", continuations lose "##", bracketed specials stay as they are."""
    import gguf

    vocab_file = model.path / "vocab.txt"
    if not vocab_file.is_file():
        raise InvalidRequestError(f"{model.path}: vocab.txt is missing (a WordPiece vocabulary is needed)")
    tokens = vocab_file.read_text(encoding="utf-8").splitlines()
    n_vocab = int(model.config.get("vocab_size", len(tokens)))
    tokens = (tokens + [f"[PAD{i}]" for i in range(len(tokens), n_vocab)])[:n_vocab]
    specials = _special_tokens(model.path)

    def phantom(token: str) -> str:
        if token.startswith("[") and token.endswith("]"):
            return token
        return token[2:] if token.startswith("##") else "\u2581" + token

    types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
    writer.add_token_type_count(int(model.config.get("type_vocab_size", 1)))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([phantom(t) for t in tokens])
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model.path, load_merges=False, n_vocab=n_vocab)
    if not hasattr(writer, "add_cls_token_id"):  # older gguf: llama.cpp takes CLS from BOS anyway
        special.special_token_ids.pop("cls", None)
    special.add_to_gguf(writer, quiet=True)


def _special_tokens(path: Path) -> set[str]:
    tokenizer = _read_json(path / "tokenizer.json", {})
    found = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    return found or {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}


def _read_json(path: Path, default: Any) -> Any:
    if not path.is_file():
        return default
    return json.loads(path.read_text(encoding="utf-8"))
