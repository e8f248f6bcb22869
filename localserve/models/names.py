"""Model names as users type them, checked before any becomes a path, and
the file-name conventions of GGUF repositories.

A name is one to three `/`-separated segments and an optional `:TAG`:
`smollm2-135m-instruct` (a catalog id), `org/repo` and `org/repo:Q4_K_M`
(the Hugging Face cache, LM Studio), `llama3.2:1b` and `hf.co/org/repo:Q8_0`
(Ollama). No segment is `..`, none is empty, no backslash, no NUL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localserve.errors import InvalidRequestError

MAX_NAME_CHARS = 200
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
MODEL_NAME_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,2}}(?::[A-Za-z0-9][A-Za-z0-9._-]*)?")
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)]
)
#: `-00001-of-00003.gguf`: one part of a GGUF split by llama.cpp's gguf-split.
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
#: Quantization names as llama.cpp's quantize writes them into file names.
_QUANT_RE = re.compile(r"(?:I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|TQ\d_\d|MXFP4)", re.IGNORECASE)
#: What `org/repo` without a tag means, as in llama-server's `-hf`.
DEFAULT_QUANT = "Q4_K_M"


def validate_model_id(name: object, *, param: str = "model") -> str:
    """`name` if it is a safe model name; else a 400 that says what one looks like."""
    if (
        not isinstance(name, str)
        or len(name) > MAX_NAME_CHARS
        or not MODEL_NAME_RE.fullmatch(name)
        or ".." in name
        or any(part.endswith(".") for part in re.split(r"[/:]", name))
        or name.split("/")[0].split(".")[0].split(":")[0].lower() in _WINDOWS_DEVICES
    ):
        shown = name[:80] + "..." if isinstance(name, str) and len(name) > 80 else name
        raise InvalidRequestError(
            f"invalid model id {shown!r}: use an id (smollm2-135m-instruct), org/repo[:QUANT] or "
            f"name[:tag]: at most {MAX_NAME_CHARS} letters, digits, '.', '_', '-', up to two '/' and one ':' "
            "(no '..', no leading '/', no backslash)",
            param=param,
        )
    return name


MAX_FILE_NAME_CHARS = 512
MAX_FILE_DEPTH = 8
_FILE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


def validate_file_name(name: object, *, param: str = "file") -> str:
    """A relative POSIX path of plain segments (`model.gguf`, `1_Pooling/config.json`)."""
    parts = name.split("/") if isinstance(name, str) else []
    if (
        not isinstance(name, str)
        or not parts
        or len(name) > MAX_FILE_NAME_CHARS
        or len(parts) > MAX_FILE_DEPTH
        or any(not _FILE_PART.fullmatch(part) or ".." in part or part.endswith(".") for part in parts)
        or any(part.split(".")[0].lower() in _WINDOWS_DEVICES for part in parts)
    ):
        raise InvalidRequestError(
            f"invalid model file name {name!r}: relative path of letters, digits, '.', '_', '+' and '-' "
            "(no '..', no absolute path, no backslash)",
            param=param,
        )
    return name


def is_model_id(text: str) -> bool:
    try:
        validate_model_id(text)
    except InvalidRequestError:
        return False
    return True


def split_tag(name: str) -> tuple[str, str]:
    """`org/repo:Q4_K_M` -> ("org/repo", "Q4_K_M"); no tag -> (name, "")."""
    base, _, tag = name.partition(":")
    return base, tag


@dataclass(frozen=True, slots=True)
class GgufFile:
    """A GGUF model in a repository: its first file, every part, its quantization."""

    name: str  # the file to load (part 1 of a split model), relative to the repo
    parts: tuple[str, ...]  # every file of the model, part 1 first
    quant: str  # "Q4_K_M", or "" if the file name says none

    @property
    def tag(self) -> str:
        """What follows `org/repo:` for this file: its quantization, else its file stem."""
        if self.quant:
            return self.quant
        stem = self.name.rsplit("/", 1)[-1]
        return re.sub(r"[^A-Za-z0-9._-]+", "-", SPLIT_RE.sub("", stem).removesuffix(".gguf")).strip("-.") or "gguf"


def quant_of(file_name: str) -> str:
    """The quantization in a GGUF file name (`...-Q4_K_M.gguf` -> "Q4_K_M"), or ""."""
    stem = SPLIT_RE.sub("", file_name.rsplit("/", 1)[-1])
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    for token in reversed(re.split(r"[.-]", stem)):
        if _QUANT_RE.fullmatch(token):
            return token.upper()
    return ""


def gguf_models(files: list[str]) -> list[GgufFile]:
    """The GGUF models among a repository's files: one per unsplit file and
    one per split set (complete sets only), projector files (`mmproj`) left out."""
    parts: dict[str, list[tuple[int, int, str]]] = {}
    singles = []
    for name in sorted(files):
        base = name.rsplit("/", 1)[-1].lower()
        if not base.endswith(".gguf") or "mmproj" in base:  # a vision projector, not a model
            continue
        split = SPLIT_RE.search(name)
        if split is None:
            singles.append(GgufFile(name, (name,), quant_of(name)))
        else:
            parts.setdefault(SPLIT_RE.sub("", name), []).append((int(split[1]), int(split[2]), name))
    for group in parts.values():
        group.sort()
        numbers = [number for number, _, _ in group]
        if numbers == list(range(1, group[0][1] + 1)):
            names = tuple(name for _, _, name in group)
            singles.append(GgufFile(names[0], names, quant_of(names[0])))
    return sorted(singles, key=lambda g: g.name)


def pick_gguf(models: list[GgufFile], tag: str) -> GgufFile | None:
    """The model `tag` names (a quantization, case-insensitive, or a file stem);
    without a tag: Q4_K_M, else the first one (as llama-server's `-hf` does)."""
    if not models:
        return None
    wanted = (tag or DEFAULT_QUANT).lower()
    for model in models:
        if model.quant.lower() == wanted or model.tag.lower() == wanted:
            return model
    if not tag:
        return models[0]
    return next((m for m in models if wanted in m.name.rsplit("/", 1)[-1].lower()), None)
