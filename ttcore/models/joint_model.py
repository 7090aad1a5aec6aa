"""A masked diffusion model whose p(x | x_t) is factorized (rank 1), CP or Tensor-Train."""

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ttcore.decompositions import DECOMPOSITIONS, HeadOutputs, get_decomposition

from .dit import DiT, DiTConfig
from .heads import FinalLayer, JointHead
from .precision import compute_context
from .vadd import RecognitionNetwork


@dataclass
class ModelConfig:
    dit: DiTConfig
    decomposition: str = "none"  # a key of ttcore.decompositions.DECOMPOSITIONS: none | cp | tt
    rank: int = 1
    head: str = "1layer"  # 1layer | 2layer (joint heads only)
    extra: dict = field(default_factory=dict)  # free-form metadata (training, data)

    def __post_init__(self):
        if isinstance(self.dit, dict):
            self.dit = DiTConfig(**self.dit)
        get_decomposition(self.decomposition)  # raises for an unknown name
        if not get_decomposition(self.decomposition).joint_head and self.rank != 1:
            raise ValueError(f"decomposition {self.decomposition!r} is rank 1, got rank {self.rank}")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")

    def to_dict(self) -> dict:
        return asdict(self)


class JointModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dit
        joint = get_decomposition(cfg.decomposition).joint_head
        self.backbone = DiT(d)
        self.output_layer = FinalLayer(d.hidden_dim, d.cond_dim, d.out_vocab,
                                       with_linear=not (joint and cfg.head == "1layer"))
        self.head = JointHead(cfg.decomposition, cfg.rank, cfg.head, d.hidden_dim, d.out_vocab) if joint else None
        if joint and cfg.head == "2layer":
            self.output_layer.linear.requires_grad_(False)  # W stays frozen (Sec. 4.5)
        # VADD (Sec. 4.4): r_phi(z | x_0, x_t), used in training only; sampling draws z from the prior
        self.recognition = (RecognitionNetwork(d.vocab_size, d.length, d.latent_dim) if d.latent_dim else None)
        self.precision = "fp32"  # inference precision (``inference.prepare_for_inference`` sets it)

    @classmethod
    def from_base(cls, base: "JointModel", decomposition: str, rank: int, head: str = "1layer",
                  noise: float = 0.0, generator: torch.Generator | None = None) -> "JointModel":
        """Fine-tuning start (Sec. 4.5): the base model's weights, a joint head initialized to keep
        its marginals, plus ``noise`` (relative std) to break rank symmetry."""
        if get_decomposition(base.cfg.decomposition).joint_head:
            raise ValueError(f"the base model must be rank 1 (decomposition 'none'), got {base.cfg.decomposition!r}")
        cfg = ModelConfig(base.cfg.dit, decomposition, rank if get_decomposition(decomposition).joint_head else 1, head,
                          dict(base.cfg.extra))
        model = cls(cfg).to(next(base.parameters()))  # same device and dtype
        state = {k: v for k, v in base.state_dict().items() if model.output_layer.linear is not None
                 or not k.startswith("output_layer.linear")}
        model.load_state_dict(state, strict=False)
        if model.head is not None:
            model.head.init_from_base(base.output_layer.linear, noise, generator)
        return model

    @property
    def latent_dim(self) -> int:
        """The VADD latent's dimension (0: no latent, an MDLM-style model)."""
        return self.cfg.dit.latent_dim

    def features(self, x_t: torch.Tensor, sigma: torch.Tensor | None = None,
                 z: torch.Tensor | None = None) -> torch.Tensor:
        """x_t [b, l] (and z [b, latent_dim] for a VADD model) -> final normalized features [b, l, d]."""
        x, c = self.backbone(x_t, sigma, z)
        return self.output_layer.features(x, c)

    def head_outputs(self, h: torch.Tensor, mask: torch.Tensor) -> HeadOutputs:
        """Run the head on the masked positions only: h [b, l, d], mask [b, l] -> the decomposition's
        HeadOutputs (float32)."""
        return self.decomposition.head_outputs(self, h, mask)

    @property
    def decomposition(self):
        """This model's entry of ``DECOMPOSITIONS``."""
        return DECOMPOSITIONS[self.cfg.decomposition]

    def core_logits(self, h: torch.Tensor) -> torch.Tensor:
        """TT only: all V x r x r core logits of positions with features h [n, d] -> [n, v, r, r] float32
        (Eq. 10 normalizes them per row j). For the exact contraction at sampling time."""
        r = self.cfg.rank
        comp = self.head.component_logits(h, self.output_layer.linear).float()  # [n, r*r, v]
        return comp.view(-1, r, r, comp.shape[-1]).permute(0, 3, 1, 2)

    # --- sampling-time pieces: only what a step needs, on the positions that need it

    def select_logits(self, h: torch.Tensor, start: torch.Tensor, count: int) -> torch.Tensor:
        """Outputs e in [start, start + count) per row (rank 1: e = 0): h [n, d] -> [n, count, v], in the
        matmul's dtype (bf16 under autocast): the sampler's float32 softmax upcasts inside its kernel."""
        if self.head is None:
            return self.output_layer.linear(h).unsqueeze(1)
        return self.head.select_logits(h, start, count, self.output_layer.linear)

    def gather_logits(self, h: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        """Outputs ``outputs`` [n, c] of each row (rank 1: output 0): h [n, d] -> [n, c, v], in the matmul's
        dtype (``JointHead.gather_logits``)."""
        if self.head is None:
            return self.output_layer.linear(h).unsqueeze(1).expand(-1, outputs.shape[1], -1)
        return self.head.gather_logits(h, outputs, self.output_layer.linear)

    def cp_weight_logits(self, h: torch.Tensor) -> torch.Tensor:
        """CP mixture weights' logits from the features of whole sequences: h [b, l, d] -> [b, r]."""
        return self.head.weights(h.mean(1)).float()

    def contracted_cores(self, h: torch.Tensor) -> torch.Tensor:
        """The contracted-core head (Sec. 4.3, special case): Gbar_j = sum_x G_j(x) predicted directly,
        row-stochastic. h [n, d] -> [n, r, r] float32."""
        r = self.cfg.rank
        return torch.softmax(self.head.contracted(h).float().view(-1, r, r), -1)

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
