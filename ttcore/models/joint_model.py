"""A masked diffusion model whose p(x | x_t) is factorized (rank 1), CP or Tensor-Train."""

from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from ttcore.decompositions import HEAD_KINDS, Decomposition, HeadOutputs, get_decomposition
from ttcore.kinds import ModelKind, kind_of

from .dit import DiT, DiTConfig
from .heads import FinalLayer
from .precision import compute_context
from .vadd import RecognitionNetwork

LATENT_DRAWS = {
    "run": "VADD (Sec. 4.4): z ~ p(z) once per sequence, fixed through the steps; trained with a recognition "
           "network r_phi(z | x_0, x_t) (Eq. 21)",
    "step": "Di4C (Hayakawa et al. 2025): z ~ p(z) again at every step, so each step draws from the mixture "
            "E_z prod_i p(x^i | x_t, z); distilled (``ttcore.distill``), no recognition network",
}


@dataclass
class ModelConfig:
    dit: DiTConfig
    decomposition: str = "none"  # a key of ttcore.decompositions.DECOMPOSITIONS: none | cp | tt
    rank: int = 1
    head: str = "1layer"  # 1layer | 2layer (joint heads only)
    extra: dict = field(default_factory=dict)  # free-form metadata (training, data)
    backbone: dict | None = None  # None: the DiT (``dit``); else a transformers masked LM (``ttcore.models.hf``),
    # ``dit`` then giving only its shape (vocabulary, length, width)
    latent_draw: str = "run"  # a latent model's z (dit.latent_dim > 0): LATENT_DRAWS

    def __post_init__(self):
        if isinstance(self.dit, dict):
            self.dit = DiTConfig(**self.dit)
        if not self.format.joint_head and self.rank != 1:  # raises for an unknown name
            raise ValueError(f"decomposition {self.decomposition!r} is rank 1, got rank {self.rank}")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if self.latent_draw not in LATENT_DRAWS:
            raise ValueError(f"latent_draw must be one of {', '.join(LATENT_DRAWS)}, got {self.latent_draw!r}")
        self.kind.check_config(self)
        if self.head not in HEAD_KINDS:
            raise ValueError(f"head must be one of {', '.join(HEAD_KINDS)}, got {self.head!r}")

    @property
    def format(self) -> Decomposition:
        """The registered format named by ``decomposition``."""
        return get_decomposition(self.decomposition)

    @property
    def kind(self) -> ModelKind:
        """The model's kind (``ttcore.kinds``: full-sequence diffusion, autoregressive, ...)."""
        return kind_of(self)

    @property
    def head_label(self) -> str:
        """The head as model cards and /models name it (the kind's ``head_label``)."""
        return self.kind.head_label(self)

    def to_dict(self) -> dict:
        return asdict(self)


class JointModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dit
        self.format = fmt = cfg.format
        joint = fmt.joint_head
        keeps_base = HEAD_KINDS[cfg.head].keeps_base
        with_linear = not joint or keeps_base  # a head that replaces W leaves the output layer without it
        if cfg.backbone is None:
            self.backbone = DiT(d)
            self.output_layer = FinalLayer(d.hidden_dim, d.cond_dim, d.out_vocab, with_linear=with_linear)
        else:  # a pretrained masked LM: its decoder is the base head W (``ttcore.models.hf``)
            from .hf import HFBackbone, MLMOutput

            self.backbone = HFBackbone(cfg.backbone)
            self.output_layer = MLMOutput(d.hidden_dim, d.out_vocab, with_linear=with_linear)
        self.head = fmt.build_head(cfg.rank, cfg.head, d.hidden_dim, d.out_vocab, self.output_layer.linear)
        if joint and keeps_base:
            self.output_layer.linear.requires_grad_(False)  # W stays frozen (Sec. 4.5)
        # VADD (Sec. 4.4): r_phi(z | x_0, x_t), used in training only; sampling draws z from the prior
        self.recognition = (RecognitionNetwork(d.vocab_size, d.length, d.latent_dim)
                            if d.latent_dim and cfg.latent_draw == "run" else None)
        self.precision = "fp32"  # inference precision (``inference.prepare_for_inference`` sets it)

    @classmethod
    def from_base(cls, base: "JointModel", decomposition: str, rank: int, head: str = "1layer",
                  noise: float = 0.0, generator: torch.Generator | None = None) -> "JointModel":
        """Fine-tuning start (Sec. 4.5): the base model's weights, a joint head initialized to keep
        its marginals, plus ``noise`` (relative std) to break rank symmetry."""
        if not base.cfg.kind.joint_heads:
            raise ValueError(f"the base model must be a masked diffusion model, got {base.cfg.kind.description}")
        if base.format.joint_head:
            raise ValueError(f"the base model must be rank 1 (decomposition 'none'), got {base.cfg.decomposition!r}")
        joint = get_decomposition(decomposition).joint_head
        cfg = ModelConfig(base.cfg.dit, decomposition, rank if joint else 1, head, dict(base.cfg.extra),
                          base.cfg.backbone, base.cfg.latent_draw)
        model = cls(cfg).to(next(base.parameters()))  # same device and dtype
        state = {k: v for k, v in base.state_dict().items() if model.output_layer.linear is not None
                 or not k.startswith("output_layer.linear")}
        model.load_state_dict(state, strict=False)
        if joint:
            model.head.init_from_base(base.output_layer.linear, noise, generator)
        return model

    def with_rank(self, rank: int, noise: float = 0.0, generator: torch.Generator | None = None) -> "JointModel":
        """This CP / TT model at a rank ``rank`` that its own rank divides, the same joint at every x_t (each hidden
        state or component split into equal copies: ``ComponentHead.init_from_smaller``), plus ``noise`` (relative
        std) to break the copies' symmetry: a distillation student with more capacity in its joint than its teacher."""
        if not self.format.joint_head:
            raise ValueError(f"only a CP or TT model grows its rank, got decomposition {self.cfg.decomposition!r}")
        model = type(self)(replace(self.cfg, rank=rank, extra=dict(self.cfg.extra))).to(next(self.parameters()))
        model.load_state_dict({k: v for k, v in self.state_dict().items() if not k.startswith("head.")}, strict=False)
        model.head.init_from_smaller(self.head, noise, generator)
        return model

    def as_blocks(self, block_size: int, length: int | None = None) -> "JointModel":
        """BD3-LM's start from a masked diffusion model, or SDAR's from an autoregressive one: this model's weights
        (backbone and head) as a block diffusion model of blocks of ``block_size`` tokens
        (``ttcore.kinds.block_diffusion``) over ``length`` positions (default its own; RoPE positions, so no weight
        depends on the length); an autoregressive model's inputs stay shifted (``DiTConfig.causal``), so at
        ``block_size`` 1 it is the same model. Its config's checks refuse what cannot be one (a latent, a pretrained
        backbone, a size that does not divide)."""
        dit = replace(self.cfg.dit, block_size=block_size, length=length or self.cfg.dit.length)
        model = type(self)(replace(self.cfg, dit=dit, extra=dict(self.cfg.extra))).to(next(self.parameters()))
        model.load_state_dict(self.state_dict())
        return model

    def as_autoregressive(self) -> "JointModel":
        """An autoregressive model (``ttcore.kinds.autoregressive``) started from this masked diffusion model's
        weights (backbone and head): the same blocks with causal attention and inputs shifted right, a starting
        point for ``ar_loss`` at a block model's budget. Refuses what cannot be one: a joint head (the AR head is
        the next-token softmax), a latent, a pretrained backbone, a block model."""
        if self.format.joint_head:
            raise ValueError(f"an autoregressive model has a rank-1 head, got decomposition {self.cfg.decomposition!r}")
        if self.cfg.backbone is not None or self.latent_dim:
            raise ValueError("an autoregressive model is the DiT without a latent: this model has a pretrained "
                             "backbone or a VADD latent")
        dit = replace(self.cfg.dit, causal=True)
        model = type(self)(replace(self.cfg, dit=dit, extra=dict(self.cfg.extra))).to(next(self.parameters()))
        model.load_state_dict(self.state_dict())
        return model

    @property
    def latent_dim(self) -> int:
        """The VADD latent's dimension (0: no latent, an MDLM-style model)."""
        return self.cfg.dit.latent_dim

    def features(self, x_t: torch.Tensor, sigma: torch.Tensor | None = None,
                 z: torch.Tensor | None = None) -> torch.Tensor:
        """x_t [b, l] (and z [b, latent_dim] for a VADD model) -> final normalized features [b, l, d]. A masked
        LM's backbone takes no time (``sigma`` ignored: no time conditioning, as MDLM)."""
        if self.cfg.backbone is not None:
            return self.backbone(x_t)
        x, c = self.backbone(x_t, sigma, z)
        return self.output_layer.features(x, c)

    def head_outputs(self, h: torch.Tensor, mask: torch.Tensor) -> HeadOutputs:
        """Run the head on the masked positions only: h [b, l, d], mask [b, l] -> the format's HeadOutputs
        (float32)."""
        return self.format.outputs(self.head, h, mask)

    def compute_context(self):
        """The context to sample under: inference mode, and bf16 autocast when prepared for bf16."""
        return compute_context(next(self.parameters()).device, self.precision)

    @torch.no_grad()
    def cast_linears_(self, dtype: torch.dtype) -> "JointModel":
        """For inference under autocast to ``dtype``: store every nn.Linear's weight and bias in it.

        CPU autocast re-casts float32 weights on every call (torch 2.13 caches no casts on CPU), so
        each denoising step paid a copy of all the weights. Casting once gives bit-identical outputs
        (autocast rounds the same way); embeddings, norms and the rest stay float32. Not for training,
        and only under autocast (a float32 input meets a bf16 weight otherwise)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.to(dtype)
        return self

    def forward(self, x_t: torch.Tensor, mask: torch.Tensor, sigma: torch.Tensor | None = None,
                z: torch.Tensor | None = None) -> HeadOutputs:
        return self.head_outputs(self.features(x_t, sigma, z), mask)
