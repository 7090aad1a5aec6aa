"""Backbone (DiT), heads and the joint model, plus checkpoint I/O."""

from .dit import DiT, DiTConfig
from .heads import FinalLayer
from .joint_model import HeadOutputs, JointModel, ModelConfig

__all__ = ["DiT", "DiTConfig", "FinalLayer", "HeadOutputs", "JointModel", "ModelConfig"]
from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_train_state,
    read_config,
    read_train_config,
    save_checkpoint,
)
from .inference import load_for_inference, prepare_for_inference
from .precision import PRECISIONS, compute_context, resolve_precision

__all__ += ["CheckpointError", "load_checkpoint", "load_train_state", "read_config", "read_train_config",
            "save_checkpoint", "PRECISIONS", "compute_context", "load_for_inference", "prepare_for_inference",
            "resolve_precision"]
