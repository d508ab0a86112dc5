"""A checkpoint directory named by a user, validated in one place before anything loads it.

A directory is accepted when its ``config.json`` is a JSON object with a ``model_type`` string, it has a
tokenizer, and every ``*.safetensors`` file is whole: its header parses, and the tensors it describes
fill the file exactly (a truncated download or a corrupt header is refused here with the file's name, not
deep inside transformers or a vLLM engine process). Only the headers are read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from skyrl_glm.usage import UsageError

# Bytes per element of each safetensors dtype.
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
_MAX_HEADER = 100 * 2**20  # the safetensors format's own limit on the JSON header
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def read_config(directory: str | Path) -> dict[str, Any]:
    """The checkpoint's ``config.json`` after validating the whole directory (config, tokenizer, weights)."""
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise UsageError(f"{directory}: no config.json (not a checkpoint directory)")
    try:
        config = json.loads(config_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{config_file}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{config_file}: must hold a JSON object, found {type(config).__name__}")
    if not isinstance(config.get("model_type"), str):
        raise UsageError(f"{config_file}: no model_type string")
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise UsageError(f"{directory}: no tokenizer (one of {', '.join(_TOKENIZER_FILES)})")
    weights = sorted(directory.glob("*.safetensors"))
    if not weights:
        raise UsageError(f"{directory}: no *.safetensors weights")
    _check_index(directory)
    for file in weights:
        check_safetensors(file)
    return config


def _check_index(directory: Path) -> None:
    """A sharded checkpoint's index names only shards that are there."""
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise UsageError(f"{index}: not a JSON object ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise UsageError(f"{index}: no weight_map of tensor name -> file")
    missing = sorted({f for f in weight_map.values() if not (directory / f).is_file()})
    if missing:
        raise UsageError(f"{index}: names shards that are missing: {', '.join(missing)}")


def text_value(config: dict[str, Any], key: str) -> Any:
    """``key`` of a config.json: at its top level, or in a multimodal model's ``text_config`` (GLM-5.3-Flash)."""
    text_config = config.get("text_config")
    return config.get(key) or (text_config.get(key) if isinstance(text_config, dict) else None)


def vocab_size(config: dict[str, Any], where: str | Path) -> int:
    """The vocabulary size from a config (top level, or a multimodal model's ``text_config``)."""
    value = text_value(config, "vocab_size")
    if not isinstance(value, int) or isinstance(value, bool) or value < 9:
        raise UsageError(f"{where}: vocab_size must be an integer > 8, got {value!r}")
    return value


def check_safetensors(file: Path) -> None:
    """Refuse a file whose header does not parse or whose tensors do not fill it exactly."""

    def bad(why: str) -> UsageError:
        return UsageError(f"{file}: not a whole safetensors file: {why}")

    size = file.stat().st_size
    with file.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise bad(f"{size} bytes, shorter than the 8-byte header length")
        header_len = int.from_bytes(prefix, "little")
        if header_len > min(size - 8, _MAX_HEADER):
            raise bad(f"header length {header_len} does not fit the file ({size} bytes): truncated or not safetensors")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    end = 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(spec, dict):
            raise bad(f"tensor {name!r} has no description")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dtype not in _DTYPE_BYTES:
            raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r} has a bad shape {shape!r}")
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):  # fmt: skip
            raise bad(f"tensor {name!r} has bad data_offsets {offsets!r}")
        if offsets[1] - offsets[0] != math.prod(shape) * _DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} {dtype}")
        end = max(end, offsets[1])
    if 8 + header_len + end != size:
        raise bad(f"its tensors need {8 + header_len + end} bytes, the file has {size} (truncated or padded)")
