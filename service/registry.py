"""The loaded checkpoints: loading and validation at start-up, precision, and which checkpoint answers
a request (``resolve``)."""

import dataclasses
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ttcore.kinds import ModelKind, pair
from ttcore.metrics.kinds import MetricsKind, default_metrics, get_metrics_kind
from ttcore.models import CheckpointError, load_for_inference, resolve_precision

from .constraints import Constraints, grammars_of
from .refusals import ModelNotFound, PromptError
from .security import clip
from .speed import Speed

log = logging.getLogger("ttcore.registry")


@dataclass(frozen=True)
class ModelFacts:
    """What the service tells of a loaded checkpoint (``GET /models`` adds this machine's estimates and sends it
    as the wire type ``models_schema.ModelInfo``, whose fields document each)."""
    model: str  # the family's name
    checkpoint: str
    domain: str
    metrics: str
    validates: bool
    depicts: bool
    decomposition: str
    rank: int
    outputs_per_position: int
    head: str
    length: int
    vocab_size: int
    parameters: int
    card_url: str | None
    summary: tuple[str, ...]
    base: str
    latent_dim: int
    distilled: dict | None = None  # teacher, objective and the step count it was distilled for (``distill.py``)
    grammars: tuple[str, ...] = ()  # what a request's ``grammar`` may name (``service.constraints``)
    ar_pair: str | None = None  # the family's autoregressive checkpoint that EDLM and DCD consult (``pair_ar``)
    kind: str = "diffusion"  # its model kind's name (``ttcore.kinds``)
    kind_steps: int | None = None  # the steps its kind gives a request that sets none (``ModelKind.default_steps``)
    block_size: int = 0  # a block diffusion model's tokens per block (0: none)

    @property
    def default_steps(self) -> int | None:
        """The steps a request that sets none gets: its kind's (an autoregressive model's length: one token a
        step), else a distilled checkpoint's own count (None: the API's)."""
        if self.kind_steps is not None:
            return self.kind_steps
        return None if self.distilled is None else self.distilled["steps"]


@dataclass
class LoadedModel:
    name: str  # the checkpoint's directory name
    family: str
    domain: str  # the tokenizer's kind: smiles, char or text
    model: torch.nn.Module
    tokenizer: object
    info: ModelFacts
    speed: Speed  # this machine's timings of the model (admission's compute estimates)
    card: str | None = None  # the model card's markdown (GET /models/{checkpoint}/card)
    constraints: Constraints | None = None  # its requests' automata, built once each (``service.constraints``)

    def __post_init__(self):
        if self.constraints is None:
            self.constraints = Constraints(self.tokenizer, self.name)

    @property
    def kind(self) -> ModelKind:
        """Its model's kind (``ttcore.kinds``): what it can generate and score, how it is named and paired."""
        return self.model.cfg.kind

    @property
    def metrics(self) -> MetricsKind:
        """What its family is measured by: whether answers carry a per-sample check (``valid``, ``valid_only``)."""
        return get_metrics_kind(self.info.metrics)


def _distilled(recorded) -> dict | None:
    """A checkpoint's record of its distillation (``distill.py``: teacher, objective, steps; a progressive run's
    rounds and first teacher), or None."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("steps"), int) or recorded["steps"] < 1:
        return None
    keep = ("teacher", "objective", "steps", "teacher_steps", "teacher_ordering", "states", "rounds", "first_teacher")
    return {k: recorded[k] for k in keep if k in recorded}


_ABSOLUTE_PATH = re.compile(r"(?<![\w./-])/(?:[\w.+-]+/)+([\w.+-]+)")


def _tokenizer_of(lm) -> object:
    """What decides that two checkpoints read tokens alike: the tokenizer's saved form (its kind otherwise)."""
    to_dict = getattr(lm.tokenizer, "to_dict", None)
    return to_dict() if to_dict is not None else (lm.domain, lm.info.vocab_size, lm.info.length)


def _read_card(path: Path) -> str | None:
    """The model card, or None when it is missing or unreadable (the model is still served). Absolute
    paths in it (a recorded command line of an older card) are cut to ``.../name``."""
    if not path.exists():
        return None
    try:
        return _ABSOLUTE_PATH.sub(r".../\1", path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        log.warning("%s/%s is unreadable (%s): served without a card", path.parent.name, path.name, type(e).__name__)
        return None


def _preference(lm: "LoadedModel", steps: int | None) -> tuple:
    """Which checkpoint serves a request that names no checkpoint, decomposition or rank: the most expressive
    joint, i.e. the most head outputs per masked position (TT r16: 256, CP r64: 64, rank 1: 1), then the higher
    rank; among equals, a checkpoint distilled for at least the request's ``steps`` first, else an undistilled
    one (a distilled student is the few-step specialist, its teacher the general one). An autoregressive
    checkpoint answers only when named (``checkpoint``): it is the baseline, not a diffusion model."""
    fits = lm.info.distilled is not None and steps is not None and steps <= lm.info.distilled["steps"]
    return lm.kind.by_default, lm.info.outputs_per_position, lm.info.rank, fits, lm.info.distilled is None


class ModelRegistry:
    """Every checkpoint directory under ``root``, loaded for inference on ``device`` in ``precision``
    (``auto`` resolved here). A directory that cannot be used is refused with a public reason (its
    name, never this machine's paths) and the others still load."""

    def __init__(self, root: str | Path, device: str = "cpu", precision: str = "auto"):
        self.device = torch.device(device)
        self.precision = resolve_precision(precision, self.device)
        log.info("precision %s (asked: %s)", self.precision, precision)
        self.models: list[LoadedModel] = []
        self.refused: dict[str, str] = {}
        root = Path(root)
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
        if not dirs:
            log.error("no checkpoints under %s", root)
        for d in dirs:
            try:
                self.models.append(self._load(d))
            except Exception as e:  # noqa: BLE001 - a damaged checkpoint is refused; the others still serve
                reason = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
                self.refused[d.name] = reason.replace(str(d.resolve()), d.name).replace(str(d), d.name)
                log.error("refusing checkpoint %s: %s", d.name, self.refused[d.name])
        self.pair_ar()

    def pair_ar(self) -> None:
        """Pair each diffusion checkpoint with its family's autoregressive checkpoint of the same tokenizer, if one
        is loaded (the first by name), for ``sampler: edlm`` and ``dcd`` (``ttcore.kinds.pair``)."""
        ars = [lm for lm in self.models if lm.kind.companion]
        for lm in self.models:
            if not lm.kind.takes_companion:
                continue
            for ar in ars:
                if ar.family != lm.family or _tokenizer_of(ar) != _tokenizer_of(lm):
                    continue
                try:
                    pair(lm.model, ar.model)
                except ValueError:
                    continue
                lm.info = dataclasses.replace(lm.info, ar_pair=ar.name)
                log.info("paired %s with %s (sampler edlm / dcd)", lm.name, ar.name)
                break

    def _load(self, d: Path) -> LoadedModel:
        model, tok, _ = load_for_inference(d, self.device, self.precision)
        cfg = model.cfg
        # the family's name and metrics (the data section's, recorded by the recipes); checkpoints written
        # before the data section: SMILES models are QM9 molecules, text models text
        family = cfg.extra.get("family", "qm9" if tok.kind == "smiles" else tok.kind)
        kind = get_metrics_kind(cfg.extra.get("metrics", default_metrics(tok.kind)))  # unregistered: refused
        card = _read_card(d / "model_card.md")
        info = ModelFacts(model=family, checkpoint=d.name, domain=tok.kind, metrics=kind.name,
                         validates=kind.validates, depicts=kind.depicts,
                         decomposition=cfg.decomposition, rank=cfg.rank,
                         outputs_per_position=cfg.format.outputs_per_position(cfg.rank),
                         head=cfg.head_label,
                         length=cfg.dit.length, vocab_size=cfg.dit.out_vocab,
                         parameters=sum(p.numel() for p in model.parameters()),
                         card_url=f"/models/{d.name}/card" if card is not None else None,
                         summary=tuple(line[2:] for line in (card or "").splitlines() if line.startswith("- "))[:8],
                         base=cfg.kind.base(cfg), latent_dim=cfg.dit.latent_dim, kind=cfg.kind.name,
                         kind_steps=cfg.kind.default_steps(cfg), block_size=cfg.dit.block_size,
                         distilled=_distilled(cfg.extra.get("distilled")), grammars=grammars_of(tok))
        log.info("loaded %s: %s %s r=%d (admission times each kind of work when a request first needs it)",
                 d.name, family, cfg.decomposition, cfg.rank)
        speed = Speed.lazy()
        return LoadedModel(d.name, family, tok.kind, model, tok, info, speed, card)

    @property
    def ready(self) -> bool:
        return bool(self.models)

    def resolve(self, family: str | None, decomposition: str | None, rank: int | None,
                checkpoint: str | None = None, steps: int | None = None) -> LoadedModel:
        """The checkpoint for (family, decomposition, rank), or the one named ``checkpoint`` (which must match
        what else is given); defaults pick the best available for ``steps`` (``_preference``)."""
        if not self.models:
            raise ModelNotFound("no checkpoints are loaded", [])
        if checkpoint is None and family is None:  # "" names no family: 404, not the first one
            family = self.models[0].family
        pool = [lm for lm in self.models if (checkpoint is None or lm.name == checkpoint)
                and (family is None or lm.family == family)
                and (decomposition is None or lm.info.decomposition == decomposition)
                and (rank is None or lm.info.rank == rank)]
        if not pool:
            available = [{"model": lm.family, "decomposition": lm.info.decomposition, "rank": lm.info.rank,
                          "checkpoint": lm.name} for lm in self.models]
            def said(v):  # the client's text, cut
                return v if v is None else clip(v, 64)
            want = f"model={said(family)!r}, decomposition={said(decomposition)!r}, rank={rank!r}" + (
                f", checkpoint={said(checkpoint)!r}" if checkpoint is not None else "")
            have = "; ".join(f"{a['model']}/{a['decomposition']}/r{a['rank']} ({a['checkpoint']})" for a in available)
            raise ModelNotFound(f"no loaded checkpoint matches {want}; available: {have}", available)
        return max(pool, key=lambda lm: _preference(lm, steps))

    @staticmethod
    def encode_prompt(lm: LoadedModel, prompt: str) -> torch.Tensor:
        """A template -> token ids [l], masks after it (raises PromptError with the reason)."""
        tok = lm.tokenizer
        try:
            ids = tok.tokenize(prompt, allow_mask=True)
        except ValueError as e:
            raise PromptError(str(e)) from None
        if len(ids) > tok.length:
            raise PromptError(f"prompt has {len(ids)} tokens, more than the model length {tok.length}")
        return torch.tensor(ids + [tok.mask_id] * (tok.length - len(ids)), dtype=torch.long)
