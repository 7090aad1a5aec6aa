"""Checkpoint directories: ``config.json``, ``model.safetensors``, ``tokenizer.json``, optional
``model_card.md`` and ``train_state/`` (optimizer, scheduler, RNG, step, data position).

Written atomically: everything goes to a temporary sibling directory, which then replaces the old
one by rename, so a killed job leaves either the old or the new checkpoint, never half of one.
Read without pickle (safetensors and JSON only); the weights' SHA-256 is recorded in config.json and
checked on load, so a truncated or corrupted file is refused with a clear error.

Why not transformers' PreTrainedModel: save_pretrained writes in place (not atomic), and the core
package would need transformers for two methods. The layout is the same HF-style one.
"""

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .joint_model import JointModel, ModelConfig

FORMAT_VERSION = 1
TRAIN_CONFIG = "train_config.json"  # the training recipe's config, beside config.json


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used; the message says what is wrong and where."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _resolve(directory: Path) -> Path:
    """A rename interrupted between its two steps leaves ``DIR.old``: use it."""
    old = directory.with_name(directory.name + ".old")
    if not directory.exists() and old.exists():
        return old
    return directory


def write_atomic(directory: str | Path, write) -> None:
    """Call ``write(tmpdir)`` to fill a fresh directory, then swap it in for ``directory``."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        write(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = directory.with_name(directory.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_checkpoint(directory: str | Path, model: JointModel, tokenizer, *, dtype: torch.dtype | None = None,
                    model_card: str | None = None, train_state: tuple[dict, dict] | None = None,
                    extra_files: dict[str, Path] | None = None, train_config: dict | None = None) -> None:
    """Write a checkpoint atomically. ``train_state`` = (tensors, json-able metadata) for resuming;
    ``dtype`` casts floating weights (e.g. bfloat16 for bundled checkpoints); ``train_config``: the recipe's
    config, written as ``train_config.json`` (the model card is rendered from it, never parsed back)."""
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu().contiguous()
             for k, v in model.state_dict().items()}

    def write(tmp: Path):
        save_file(state, str(tmp / "model.safetensors"))
        config = {"format_version": FORMAT_VERSION, "model": model.cfg.to_dict(),
                  "weights_sha256": _sha256(tmp / "model.safetensors")}
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        tokenizer.save(tmp)
        if model_card is not None:
            (tmp / "model_card.md").write_text(model_card)
        if train_config is not None:
            (tmp / TRAIN_CONFIG).write_text(json.dumps(train_config, indent=1))
        if train_state is not None:
            (tmp / "train_state").mkdir()
            tensors, meta = train_state
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "train_state" / "state.safetensors"))
            meta = dict(meta, state_sha256=_sha256(tmp / "train_state" / "state.safetensors"))
            (tmp / "train_state" / "state.json").write_text(json.dumps(meta, indent=1))
        for name, src in (extra_files or {}).items():
            shutil.copy(src, tmp / name)

    write_atomic(directory, write)


def read_train_config(directory: str | Path) -> dict | None:
    """The recipe's config a checkpoint was trained with (``train_config.json``), or None when it has none."""
    path = _resolve(Path(directory)) / TRAIN_CONFIG
    return json.loads(path.read_text()) if path.is_file() else None


def read_config(directory: str | Path) -> dict:
    directory = _resolve(Path(directory))
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} is not a checkpoint: config.json is missing or not a file")
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable UTF-8 JSON ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(config).__name__}")
    if config.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format_version must be {FORMAT_VERSION}, got {config.get('format_version')!r}")
    return config


def load_checkpoint(directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """-> (model in eval mode, tokenizer, config dict). Raises CheckpointError with the reason."""
    from ttcore.tokenizers import load_tokenizer

    directory = _resolve(Path(directory))
    config = read_config(directory)
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{directory}: model.safetensors is missing or not a file")
    digest = _sha256(weights)
    if digest != config.get("weights_sha256"):
        raise CheckpointError(f"{weights} is corrupted or truncated: SHA-256 {digest[:12]}... does not match "
                              f"config.json's {str(config.get('weights_sha256'))[:12]}...")
    try:
        state = load_file(str(weights))
        model_cfg = ModelConfig(**config["model"])
        model = JointModel(model_cfg)
        model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
    except (SafetensorError, RuntimeError, TypeError, KeyError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{directory}: weights do not fit the configured model ({type(e).__name__}: {e})") \
            from None
    try:
        tokenizer = load_tokenizer(directory)
    except Exception as e:  # noqa: BLE001 - any damage to tokenizer.json is the same answer: unusable
        raise CheckpointError(f"{directory}: tokenizer.json is unusable ({type(e).__name__}: {e})") from None
    return model.to(device).eval(), tokenizer, config


def load_train_state(directory: str | Path) -> tuple[dict, dict] | None:
    """(tensors, metadata) saved for resuming, or None when the checkpoint has none."""
    ts = _resolve(Path(directory)) / "train_state"
    if not (ts / "state.json").exists():
        return None
    meta = json.loads((ts / "state.json").read_text())
    if _sha256(ts / "state.safetensors") != meta.get("state_sha256"):
        raise CheckpointError(f"{ts}/state.safetensors is corrupted or truncated (SHA-256 mismatch)")
    return load_file(str(ts / "state.safetensors")), meta
