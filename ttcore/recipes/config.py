"""A recipe's config (``TrainConfig``): the ``model:`` section (architecture, ``size`` presets, the joint
head), the ``data:`` section (``ttcore.data.section``) and the optimization and run settings; ``load_config``
reads a YAML file with ``key=value`` overrides. Configs written before the ``data:`` section are migrated once,
by ``training/export.py`` (``migrate_train_config``), not read here."""

from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

import yaml

from ttcore.data.section import DataSection, coerce_numbers
from ttcore.models import DiTConfig
from ttcore.models.precision import PRECISIONS


def _dit_config(self, tokenizer) -> DiTConfig:
    return DiTConfig.for_tokenizer(tokenizer, **{k: getattr(self, k) for k in self.BACKBONE})


_BACKBONE = [f for f in fields(DiTConfig) if f.name not in ("vocab_size", "out_vocab", "length")]
# The model a recipe builds (the ``model:`` section of a config): DiTConfig's architecture fields with
# its defaults (pretraining only: a fine-tune keeps its base's; vocabulary and length come from the
# tokenizer), then the joint head (fine-tuning): decomposition none | cp | tt, rank, head 1layer | 2layer,
# and head_noise, the relative std of the noise that breaks the symmetry of the head's copies.
ModelSection = make_dataclass("ModelSection", [(f.name, f.type, field(default=f.default)) for f in _BACKBONE] + [
    ("decomposition", str, field(default="none")), ("rank", int, field(default=1)),
    ("head", str, field(default="1layer")), ("head_noise", float, field(default=0.05)),
    ("size", str | None, field(default=None))],
    namespace={"BACKBONE": tuple(f.name for f in _BACKBONE), "dit_config": _dit_config})
# ``model: size:`` presets (pretraining): width, conditioning width, blocks, heads. Parameters at MOSES's shape
# (l = 54, v = 24): s 6.0M, m 29M, l 77M, xl 114M (``benchmarks/train_throughput.py`` prints them). A size
# sets these four fields, whatever the section says of them.
MODEL_SIZES = {"s": dict(hidden_dim=256, cond_dim=128, n_blocks=6, n_heads=8),
               "m": dict(hidden_dim=512, cond_dim=128, n_blocks=8, n_heads=8),
               "l": dict(hidden_dim=768, cond_dim=128, n_blocks=10, n_heads=12),
               "xl": dict(hidden_dim=1024, cond_dim=256, n_blocks=8, n_heads=16)}


MODEL_KEYS = frozenset(f.name for f in fields(ModelSection))
DATA_KEYS = frozenset(f.name for f in fields(DataSection)) - {"source"}  # ``data=NAME`` sets the source


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    # optimization
    batch_size: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 500
    total_steps: int = 20000  # length of the cosine schedule; --max-steps may stop earlier
    weight_decay: float = 0.0
    beta2: float = 0.99
    grad_clip: float = 1.0
    eps: float = 1e-3  # the smallest time t a step draws, t ~ U[eps, 1] (a block model's: each block's)
    # run
    seed: int = 0
    # bf16 autocast for matmuls (losses and normalizers stay float32), fp32, or auto: bf16 where the device runs
    # it natively (CUDA; a CPU with AVX512-BF16 / AMX), fp32 elsewhere (emulated bf16 trained ~5x slower here).
    # A run resolves auto on its device and records the precision it trained in.
    precision: str = "auto"
    compile: bool = False  # torch.compile the backbone (fixed shapes [b, l]; heads see dynamic m)
    grad_accum: int = 1  # micro-batches per step: batch_size is the step's batch, run in this many pieces
    activation_checkpointing: bool = False  # recompute the backbone's activations in backward (less memory)
    device: str = "auto"
    threads: int = 0  # 0: all cores
    log_every: int = 20
    val_every: int = 500
    val_batches: int = 8
    ckpt_minutes: float = 10.0
    ema_decay: float = 0.0  # > 0: validate, checkpoint and export the EMA of the weights (MDLM / VADD: 0.9999)
    # fine-tuning levers (issue: quality): the weight of the marginal-consistency term (``mdlm_loss``), the
    # learning rate of everything outside the backbone relative to ``lr``, and the steps the backbone is frozen
    marginal_weight: float = 0.0
    kl_weight: float = 1.0  # VADD models (model.latent_dim > 0): lambda of Eq. 21
    head_lr_ratio: float = 1.0
    freeze_backbone_steps: int = 0
    data: DataSection = field(default_factory=DataSection)  # the family (ttcore.data.section)


    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = ModelSection(**self.model)
        if not isinstance(self.data, DataSection):
            self.data = DataSection.from_value(self.data)
        coerce_numbers(self)
        coerce_numbers(self.model, "model.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.grad_accum < 1 or self.batch_size % self.grad_accum:
            raise ValueError(f"grad_accum must be >= 1 and divide batch_size ({self.batch_size}), "
                             f"got {self.grad_accum}")
        if self.model.size is not None:
            if self.model.size not in MODEL_SIZES:
                raise ValueError(f"model.size must be one of {list(MODEL_SIZES)}, got {self.model.size!r}")
            for key, value in MODEL_SIZES[self.model.size].items():
                setattr(self.model, key, value)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """From a config's values, the ``model`` and ``data`` sections nested. Unknown keys are an error that
        lists the known (a config written before the sections: ``training/export.py`` migrates it)."""
        values = dict(values)
        section = dict(values.pop("model", None) or {})
        model_keys = {f.name for f in fields(ModelSection)}
        known = {f.name for f in fields(cls)} - {"model"}
        flat = sorted((set(values) - known) & (model_keys | {"family", "tokenizer", "bpe_vocab", "val_fraction"}))
        if flat:
            raise ValueError(f"config keys {flat} belong in the model: / data: sections (a config written before "
                             "them: `python training/export.py --src DIR --out DIR` migrates a checkpoint's)")
        unknown = sorted(set(values) - known) + sorted(f"model.{k}" for k in set(section) - model_keys)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; known: {sorted(known)} and model.{sorted(model_keys)}")
        return cls(model=ModelSection(**section), **values)


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """A YAML file, then ``key=value`` overrides: ``model.rank=8`` / ``data.length=32``, or a section's key without
    its prefix (``rank=8``, ``length=32``); ``data=NAME`` names the source."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found")
    values = yaml.safe_load(path.read_text()) or {}
    for item in overrides:
        key, _, raw = item.partition("=")
        section, _, name = key.partition(".") if key.startswith(("model.", "data.")) else ("", "", key)
        if section == "model" or (not section and key in MODEL_KEYS):
            values.setdefault("model", {})[name] = yaml.safe_load(raw)
        elif section == "data" or (not section and key in DATA_KEYS):
            if not isinstance(values.get("data"), dict):  # a bare source name or path: the section it names
                values["data"] = {} if values.get("data") is None else {"source": values["data"]}
            values["data"][name] = yaml.safe_load(raw)
        else:
            values[key] = yaml.safe_load(raw)
    return TrainConfig.from_dict(values)
