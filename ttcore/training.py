"""The parts a training recipe is made of: the config (``TrainConfig``: the ``model:`` and ``data:``
sections and the optimization settings), the LR schedule, the resumable data order, the weights' EMA, the
optimizer and RNG state a checkpoint carries, validation, and the model card rendered from the config.

The loop that puts them together belongs to the recipes (``training/_loop.py``, run by
``training/pretrain.py`` and ``training/finetune.py``), as torchtune's recipes own theirs.
"""

import contextlib
import json
import math
import shlex
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from pathlib import Path

import torch
import yaml

from ttcore.data.section import DataSection, coerce_numbers
from ttcore.losses import mdlm_loss, vadd_loss
from ttcore.models import DiTConfig, JointModel

SPLIT_SEED_STRIDE = 100_003  # BatchOrder: seed * stride + epoch seeds each epoch's permutation
RESEED_STRIDE = 1_000_003  # a run moved between CPU and CUDA reseeds its mask stream from seed + stride * step


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
    eps: float = 1e-3
    # run
    seed: int = 0
    precision: str = "bf16"  # bf16 autocast for matmuls; losses and normalizers stay float32
    compile: bool = False  # torch.compile the backbone (fixed shapes [b, l]; heads see dynamic m)
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
        if self.model.size is not None:
            if self.model.size not in MODEL_SIZES:
                raise ValueError(f"model.size must be one of {list(MODEL_SIZES)}, got {self.model.size!r}")
            for key, value in MODEL_SIZES[self.model.size].items():
                setattr(self.model, key, value)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """From a config's values: the ``model`` section nested, or its keys at the top level (as the
        model cards of earlier checkpoints record them). Unknown keys are an error that lists the known."""
        values = _data_section(dict(values))
        section = dict(values.pop("model", None) or {})
        model_keys = {f.name for f in fields(ModelSection)}
        for key in [k for k in values if k in model_keys]:
            section[key] = values.pop(key)
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(values) - known) + sorted(f"model.{k}" for k in set(section) - model_keys)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; known: {sorted(known)} and model.{sorted(model_keys)}")
        return cls(model=ModelSection(**section), **values)


_FLAT_DATA_KEYS = ("family", "tokenizer", "bpe_vocab", "length", "val_fraction")


def _data_section(values: dict) -> dict:
    """Configs written before the ``data:`` section kept ``data`` as a source name or path and its settings at the
    top level (every key recorded, the text-only ones too): read them as the section they meant."""
    flat = {k: values.pop(k) for k in _FLAT_DATA_KEYS if k in values}
    data = values.get("data")
    if isinstance(data, str) or (data is None and flat):
        data = data or "qm9"
        section = {"source": data, **{k: flat[k] for k in ("family", "val_fraction") if k in flat}}
        if data == "text":  # the tokenizer keys meant something only for text
            section.update({k: flat[k] for k in ("tokenizer", "bpe_vocab", "length") if k in flat})
        values["data"] = section
    elif flat:
        values["data"] = {**(data or {}), **flat}
    return values


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """A YAML file, then ``key=value`` overrides (``model.rank=8``, or ``rank=8`` for a model key)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found")
    values = yaml.safe_load(path.read_text()) or {}
    for item in overrides:
        key, _, raw = item.partition("=")
        if key.startswith("model."):
            values.setdefault("model", {})[key[len("model."):]] = yaml.safe_load(raw)
        elif key.startswith("data."):
            if not isinstance(values.get("data"), dict):
                values["data"] = {} if values.get("data") is None else _data_section({"data": values["data"]})["data"]
            values["data"][key[len("data."):]] = yaml.safe_load(raw)
        else:
            values[key] = yaml.safe_load(raw)
    return TrainConfig.from_dict(values)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def lr_at(step: int, lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at total_steps."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    frac = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


class BatchOrder:
    """Epoch-wise seeded permutations; the position (epoch, index) is all a resume needs."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int = 0, index: int = 0):
        self.n, self.batch_size, self.seed, self.epoch, self.index = n, batch_size, seed, epoch, index
        self._perm = self._permutation()

    def _permutation(self):
        seed = self.seed * SPLIT_SEED_STRIDE + self.epoch
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(seed))

    def next(self) -> torch.Tensor:
        if self.index + self.batch_size > self.n:
            self.epoch, self.index = self.epoch + 1, 0
            self._perm = self._permutation()
        idx = self._perm[self.index: self.index + self.batch_size]
        self.index += self.batch_size
        return idx


class WeightEMA:
    """Exponential moving average of the trainable weights, in float32, with the usual warm-up decay
    min(decay, (1 + n) / (10 + n)) after n updates, so early averages do not stay near the initialization."""

    def __init__(self, model: JointModel, decay: float, updates: int = 0):
        self.decay, self.updates = decay, updates
        self.shadow = {n: p.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, model: JointModel) -> None:
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for n, p in model.named_parameters():
            if n in self.shadow:
                self.shadow[n].mul_(d).add_(p.detach().float(), alpha=1 - d)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self, model: JointModel):
        """The model holds the averaged weights inside the block, its own after; yields its own weights."""
        params = dict(model.named_parameters())
        raw = {n: params[n].detach().clone() for n in self.shadow}
        with torch.no_grad():
            for n, v in self.shadow.items():
                params[n].copy_(v)
        try:
            yield raw
        finally:
            with torch.no_grad():
                for n, v in raw.items():
                    params[n].copy_(v)


def autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


@torch.no_grad()
def evaluate_loss(model, tokens: torch.Tensor, mask_id: int, *, batch_size: int, batches: int, precision: str,
                  eps: float, device, kl_weight: float = 1.0) -> dict:
    """Validation metrics with a fixed RNG (comparable across runs), each the mean over
    ``min(batches, len(tokens) // batch_size)`` batches of what ``mdlm_loss`` returns per batch:
    ``nll`` (joint NLL per masked token, the training objective), ``marginal_nll`` (per masked token,
    each scored by its exact single-position marginal) and ``nelbo`` (the continuous-time bound's
    one-sample estimate, nats per position, padding included; comparable across ranks)."""
    model.eval()
    g = torch.Generator(device).manual_seed(1234)
    vadd = bool(getattr(model, "latent_dim", 0))
    # a VADD model: Eq. 21's terms instead (``vadd_loss``): ``nll`` given z ~ r_phi, ``kl``, and ``objective``,
    # the Eq. 21 estimate at lambda = ``kl_weight``, nats per token: the training objective, NOT a bound on
    # -log p(x) (z is drawn given x at every t and its KL weighted by 1/t there; measured below the data
    # entropy on a two-token toy), so it compares VADD runs with each other only
    totals = {"nll": 0.0, "kl": 0.0, "objective": 0.0} if vadd else {"nll": 0.0, "marginal_nll": 0.0, "nelbo": 0.0}
    n = min(batches, max(1, len(tokens) // batch_size))
    for k in range(n):
        x0 = tokens[k * batch_size:(k + 1) * batch_size].to(device)
        with autocast(device, precision), torch.no_grad():
            if vadd:
                out = vadd_loss(model, x0, mask_id, kl_weight, eps, generator=g)
                out["objective"] = out["loss"] - out["lc"]
            else:
                out = mdlm_loss(model, x0, mask_id, eps, generator=g)
        for key in totals:
            totals[key] += out[key].item() / n
    model.train()
    return totals


def optimizer_state(opt) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                tensors[f"opt.{pid}.{key}"] = val
            else:
                scalars[f"{pid}.{key}"] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(opt, tensors: dict, meta: dict) -> None:
    state: dict = {}
    for name, val in tensors.items():
        if name.startswith("opt."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = val
    for name, val in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = val
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def restore_generator(gen: torch.Generator, state: torch.Tensor, meta: dict, seed: int) -> None:
    """The mask stream continues exactly on the device type it was saved on. A run that moves between
    CPU and CUDA cannot continue it (the generators' states differ in kind), so it reseeds from
    (seed, step), which is deterministic too, and the move is recorded in the metadata."""
    saved_on = torch.device(meta.get("device", "cpu")).type
    if saved_on == gen.device.type:
        gen.set_state(state)
        return
    gen.manual_seed(seed + RESEED_STRIDE * meta["step"])
    meta.setdefault("device_moves", []).append({"step": meta["step"], "from": saved_on, "to": gen.device.type})


def public_command(argv: list[str]) -> str:
    """The command line as cards record it: absolute paths under the working directory made relative,
    any other absolute path cut to its last component (``.../name``), so a card never tells where the
    trainer's files were."""
    cwd = Path.cwd()
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=") if arg.startswith("--") or "=" in arg else ("", "", arg)
        if value.startswith("/"):
            p = Path(value)
            value = str(p.relative_to(cwd)) if p.is_relative_to(cwd) else f".../{p.name}"
        out.append(key + eq + value)
    return shlex.join(out)


def validation_summary(val: dict) -> str:
    """One line for model cards and logs; the names are those of ``evaluate_loss``."""
    nan = float("nan")
    if "kl" in val:
        return (f"joint NLL given z ~ r_phi {val['nll']:.4f} nats per masked token, KL(r_phi || p(z)) "
                f"{val['kl']:.4f} nats per sequence, Eq. 21 objective {val['objective']:.4f} nats per token (VADD)")
    return (f"joint NLL {val.get('nll', nan):.4f} nats per masked token (the training objective), "
            f"marginal NLL {val.get('marginal_nll', nan):.4f} per masked token, "
            f"NELBO {val.get('nelbo', nan):.4f} nats per position (bound from the exact marginals, padding "
            f"included)")


def throughput_line(t: dict) -> str:
    """The run's speed as cards and the recipes' last line give it (``ttcore.flops``)."""
    return (f"- throughput: {t['tokens_per_second']:,.0f} tokens/s in training steps ({t['processes']} "
            f"process{'es' if t['processes'] > 1 else ''}), MFU {100 * t['mfu']:.1f}% of {t['peak']} "
            f"({t['peak_flops'] / 1e12:.3g} TFLOP/s; {t['flops_per_token'] / 1e6:.3g} MFLOP a token: 6N plus "
            f"attention)")


def _stopped_early(stop: dict) -> str:
    by = "the wall-clock safety stop (--max-minutes)" if stop["by"] == "max_minutes" else "a signal"
    return (f"- stopped early: at step {stop['step']} of the {stop['of']} asked, by {by}; a comparison at an equal "
            "budget needs equal steps")


def model_card(title: str, cfg: TrainConfig, model: JointModel, meta: dict) -> str:
    n_params = sum(p.numel() for p in model.parameters())
    lines = [f"# {title}", "", f"- decomposition: {model.cfg.decomposition}, rank {model.cfg.rank}, "
             f"head {model.cfg.head_label}",
             f"- parameters: {n_params / 1e6:.2f}M; length {model.cfg.dit.length}, vocab {model.cfg.dit.out_vocab}",
             f"- data: {cfg.data.source} ({cfg.data.tokenizer} tokenizer, validation fraction {cfg.data.val_fraction}, "
             f"split seed 0; family {cfg.data.family}, metrics {cfg.data.metrics})",
             f"- steps: {meta['step']}, wall time {meta['wall_seconds'] / 3600:.2f} h "
             f"({meta['seconds_per_step']:.3f} s/step, batch {cfg.batch_size}, {meta['device']})",
             *([_stopped_early(meta["stopped_early"])] if meta.get("stopped_early") else []),
             *([throughput_line(meta["throughput"])] if meta.get("throughput") else []),
             "- validation: " + validation_summary(meta["val"]),
             *([f"- weights: the EMA of the training weights (decay {cfg.ema_decay:g}, {meta.get('ema_updates', 0)} "
                f"updates); validation uses them too"] if cfg.ema_decay > 0 else []),
             "", "## Commands", "", *[f"    {c}" for c in meta["commands"]],
             "", "## Config", "", "```json", json.dumps(asdict(cfg), indent=1), "```", ""]
    return "\n".join(lines)
