"""A sentence-transformers BERT folder as OpenVINO IR, for the OpenVINO
embeddings backend: no torch.

The IR is the ONNX graph of `convert_onnx` (BERT, then the folder's own
pooling and normalisation from `modules.json`) read by OpenVINO's ONNX
frontend and saved as `<stem>.xml` + `<stem>.bin`, weights kept in float32
(the device picks its inference precision). Batch and sequence stay dynamic;
the backend fixes them only for the NPU. The WordPiece tokenizer is copied
beside it as `<stem>.tokenizer.json`, as for the ONNX graph, so both
backends take the same token ids.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from localserve.models.convert.bert_onnx import cached_onnx, tokenizer_path
from localserve.models.convert.cache import Progress, read_sentence_transformers, store_target

#: rt_info keys the backend reads (what the graph computes after BERT).
POOLING_KEY, NORMALIZE_KEY = ("localserve", "pooling"), ("localserve", "normalize")


def cached_openvino_embeddings(
    source: Path, name: str, *, force: bool = False, progress: Progress | None = None
) -> Path:
    """The IR (.xml) of the folder `source`, converted now unless the store has it."""
    model = read_sentence_transformers(source)
    target = store_target(model, name, "f32-openvino.xml")
    if target.is_file() and target.with_suffix(".bin").is_file() and tokenizer_path(target).is_file() and not force:
        return target
    onnx_path = cached_onnx(source, name, force=force, progress=progress)
    save_ir(onnx_path, target, {POOLING_KEY: model.pooling, NORMALIZE_KEY: str(model.normalize)})
    return target


def save_ir(onnx_path: Path, target: Path, rt_info: dict[tuple[str, str], str]) -> None:
    """Convert and write the IR pair, with `rt_info`, into place; the .xml
    moves last, so a reader that finds it finds its .bin and tokenizer too."""
    import openvino as ov

    model = ov.convert_model(str(onnx_path))
    for key, value in rt_info.items():
        model.set_rt_info(value, list(key))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.stem}.", dir=target.parent) as tmp:
        xml = Path(tmp) / target.name
        ov.save_model(model, str(xml), compress_to_fp16=False)
        shutil.copyfile(tokenizer_path(onnx_path), tokenizer_path(xml))
        for built in (xml.with_suffix(".bin"), tokenizer_path(xml), xml):
            built.replace(target.parent / built.name)
