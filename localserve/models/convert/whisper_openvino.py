"""A CTranslate2 Whisper folder as an OpenVINO IR folder for openvino-genai's
`WhisperPipeline`, converted once and cached in the model store.

The path: CTranslate2 `model.bin` -> the tensors of transformers'
`WhisperForConditionalGeneration` (one-to-one, fused projections split) plus
the config, generation config, feature-extractor config and tokenizer files
the folder lacks -> optimum-intel's OpenVINO export (encoder, stateful
decoder, and the tokenizer/detokenizer through openvino-tokenizers).

Needs the `convert` extra (torch, transformers, optimum-intel) at conversion
time only: the server imports this module only when a cached IR is missing,
and serving the IR never imports torch.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from localserve.disk import storage_guard
from localserve.errors import LocalServeError
from localserve.models.convert.cache import Progress
from localserve.models.convert.supersede import remove_superseded
from localserve.models.convert.whisper import Ct2Whisper, openai_state_dict, read_ctranslate2, store_target

#: What WhisperPipeline loads; a folder holding all of them is a finished export.
IR_FILES = (
    "openvino_encoder_model.xml",
    "openvino_decoder_model.xml",
    "openvino_tokenizer.xml",
    "openvino_detokenizer.xml",
    "generation_config.json",
    "preprocessor_config.json",
)
CONVERT_PACKAGES = ("torch", "transformers", "optimum.intel", "openvino_tokenizers")
STAGES = ("read CTranslate2 weights", "write transformers folder", "export to OpenVINO IR", "done")
# openai-whisper name parts -> transformers' (applied in order).
_HF_NAMES = (
    ("encoder.positional_embedding", "encoder.embed_positions.weight"),
    ("decoder.positional_embedding", "decoder.embed_positions.weight"),
    ("decoder.token_embedding", "decoder.embed_tokens"),
    ("encoder.ln_post", "encoder.layer_norm"),
    ("decoder.ln.", "decoder.layer_norm."),
    (".blocks.", ".layers."),
    (".cross_attn_ln.", ".encoder_attn_layer_norm."),
    (".attn_ln.", ".self_attn_layer_norm."),
    (".mlp_ln.", ".final_layer_norm."),
    (".cross_attn.", ".encoder_attn."),
    (".attn.", ".self_attn."),
    (".query.", ".q_proj."),
    (".key.", ".k_proj."),
    (".value.", ".v_proj."),
    (".out.", ".out_proj."),
    (".mlp.0.", ".fc1."),
    (".mlp.2.", ".fc2."),
)


def is_openvino_whisper(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in IR_FILES)


def missing_convert_packages() -> list[str]:
    """The `convert` extra's modules that are not installed (empty: it is)."""
    import importlib.util

    missing = []
    for module in CONVERT_PACKAGES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(module)
    return missing


def cached_openvino(source: Path, name: str, *, force: bool = False, progress: Progress | None = None) -> Path:
    """The OpenVINO IR folder of the CTranslate2 folder `source`, exported now
    unless the model store has it. The export goes to a temporary folder that
    is renamed into place when complete."""
    target = store_target(source, name, "openvino")
    if is_openvino_whisper(target) and not force:
        return target
    missing = missing_convert_packages()
    if missing:
        raise LocalServeError(
            f"converting {source} to OpenVINO needs the `convert` extra (missing: {', '.join(missing)}); "
            "install it with: pip install 'localserve[convert]'"
        )
    report = progress or (lambda stage, done, total: None)
    report(STAGES[0], 0, 3)
    model = read_ctranslate2(source)
    with storage_guard(target.parent, f"converting {name} to OpenVINO"):  # the work folder goes either way
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent))
        try:
            report(STAGES[1], 1, 3)
            write_transformers_folder(model, work / "hf")
            report(STAGES[2], 2, 3)
            _export(work / "hf", work / "ir")
            if target.exists():
                shutil.rmtree(target)
            (work / "ir").rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    remove_superseded(target)
    report(STAGES[3], 3, 3)
    return target


def hf_state_dict(model: Ct2Whisper) -> dict[str, np.ndarray]:
    """The tensors under `WhisperForConditionalGeneration`'s names (the output
    projection is tied to the token embeddings, as in every Whisper)."""
    out = {}
    for name, tensor in openai_state_dict(model).items():
        for old, new in _HF_NAMES:
            name = name.replace(old, new)
        out["model." + name] = np.ascontiguousarray(tensor)
    return out


def write_transformers_folder(model: Ct2Whisper, folder: Path) -> None:
    """A folder `transformers` and optimum load: weights, config, generation
    config, feature extractor and tokenizer files."""
    from safetensors.numpy import save_file
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperTokenizerFast

    folder.mkdir(parents=True)
    tokens = _special_tokens(model)
    config = WhisperConfig(
        vocab_size=model.n_vocab,
        num_mel_bins=model.n_mels,
        d_model=model.d_model,
        encoder_layers=model.num_layers("encoder"),
        decoder_layers=model.num_layers("decoder"),
        encoder_attention_heads=model.num_heads("encoder"),
        decoder_attention_heads=model.num_heads("decoder"),
        encoder_ffn_dim=int(model.variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(model.variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=model.n_audio_ctx,
        max_target_positions=model.n_text_ctx,
        decoder_start_token_id=tokens["<|startoftranscript|>"],
        bos_token_id=tokens["<|endoftext|>"],
        eos_token_id=tokens["<|endoftext|>"],
        pad_token_id=tokens["<|endoftext|>"],
        begin_suppress_tokens=list(model.config.get("suppress_ids_begin", [])),
        suppress_tokens=list(model.config.get("suppress_ids", [])),
        tie_word_embeddings=True,
        architectures=["WhisperForConditionalGeneration"],
    )
    config.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(_generation_config(model, tokens), indent=2))
    WhisperFeatureExtractor(feature_size=model.n_mels).save_pretrained(folder)
    shutil.copyfile(model.path / "tokenizer.json", folder / "tokenizer.json")
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=model.n_text_ctx,
    )
    _add_timestamp_tokens(tokenizer, model)
    tokenizer.save_pretrained(folder)
    save_file({k: v.astype(np.float32) for k, v in hf_state_dict(model).items()}, str(folder / "model.safetensors"))


def _special_tokens(model: Ct2Whisper) -> dict[str, int]:
    return {t["content"]: int(t["id"]) for t in model.tokenizer().get("added_tokens", []) if t.get("special")}


def _add_timestamp_tokens(tokenizer: Any, model: Ct2Whisper) -> None:
    """<|0.00|> ... <|30.00|>: the ids after <|notimestamps|>, which older
    tokenizer.json files leave out, so the vocabulary matches the model's."""
    from tokenizers import AddedToken

    first = len(tokenizer)
    names = [f"<|{0.02 * i:.2f}|>" for i in range(model.n_vocab - first)]
    tokenizer.add_tokens([AddedToken(n, lstrip=False, rstrip=False, normalized=False) for n in names])


def _generation_config(model: Ct2Whisper, tokens: dict[str, int]) -> dict[str, Any]:
    """What WhisperPipeline reads: special token ids, suppression lists and,
    for a multilingual model, the language and task tokens."""
    config: dict[str, Any] = {
        "alignment_heads": model.config.get("alignment_heads", []),
        "begin_suppress_tokens": list(model.config.get("suppress_ids_begin", [])),
        "suppress_tokens": list(model.config.get("suppress_ids", [])),
        "bos_token_id": tokens["<|endoftext|>"],
        "decoder_start_token_id": tokens["<|startoftranscript|>"],
        "eos_token_id": tokens["<|endoftext|>"],
        "pad_token_id": tokens["<|endoftext|>"],
        "no_timestamps_token_id": tokens["<|notimestamps|>"],
        "prev_sot_token_id": tokens["<|startofprev|>"],
        "max_initial_timestamp_index": 50,
        "max_length": model.n_text_ctx,
        "is_multilingual": model.multilingual,
        "return_timestamps": False,
    }
    if model.multilingual:
        first, last = tokens["<|startoftranscript|>"], tokens["<|translate|>"]  # the language tokens lie between
        config["lang_to_id"] = {content: i for content, i in tokens.items() if first < i < last}
        config["task_to_id"] = {"transcribe": tokens["<|transcribe|>"], "translate": tokens["<|translate|>"]}
    else:
        config["forced_decoder_ids"] = [[1, tokens["<|notimestamps|>"]]]
    return config


def _export(hf_folder: Path, ir_folder: Path) -> None:
    """optimum-intel's export: encoder + stateful decoder (float32 weights:
    this model is small and f32 keeps its accuracy), and the tokenizers."""
    from optimum.exporters.openvino import main_export

    main_export(
        str(hf_folder),
        output=ir_folder,
        task="automatic-speech-recognition-with-past",
        library_name="transformers",
        local_files_only=True,
        convert_tokenizer=True,
    )
    for name in IR_FILES:
        if not (ir_folder / name).is_file():
            raise LocalServeError(f"the OpenVINO export of {hf_folder} wrote no {name}")
