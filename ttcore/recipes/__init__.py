"""The parts a training recipe is made of, one module per concern: the config (``TrainConfig``: the ``model:``
and ``data:`` sections and the optimization settings), the LR schedule and the resumable data order, the
weights' EMA, the optimizer and RNG state a checkpoint carries, validation, and the model card. Data-parallel
training is ``ttcore.parallel``.

The loop that puts them together belongs to the recipes (``training/_loop.py``, run by
``training/pretrain.py`` and ``training/finetune.py``), as torchtune's recipes own theirs.
"""

from .cards import model_card, public_command, throughput_line, validation_summary
from .config import MODEL_KEYS, MODEL_SIZES, ModelSection, TrainConfig, load_config
from .ema import WeightEMA
from .schedule import SPLIT_SEED_STRIDE, BatchOrder, lr_at
from .state import RESEED_STRIDE, load_optimizer_state, optimizer_state, restore_generator
from .validation import autocast, evaluate_loss, pick_device

__all__ = ["MODEL_KEYS", "MODEL_SIZES", "RESEED_STRIDE", "SPLIT_SEED_STRIDE", "BatchOrder", "ModelSection",
           "TrainConfig", "WeightEMA", "autocast", "evaluate_loss", "load_config", "load_optimizer_state", "lr_at",
           "model_card", "optimizer_state", "pick_device", "public_command", "restore_generator", "throughput_line",
           "validation_summary"]
