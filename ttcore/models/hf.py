"""A pretrained bidirectional masked LM from ``transformers`` as ttcore's backbone (ModernBERT, BERT, RoBERTa,
ESM, ...): the paper's joint heads on the models people hold.

The masked LM maps hidden states to logits through its MLM head: a transform (dense, activation, norm) and a
final affine map, its decoder W h + b (tied to the input embeddings). ttcore's backbone is everything before that
affine map (``HFBackbone``: x_t -> the features the decoder reads), and the affine map is the base head W of
Sec. 4.5 (``output_layer.linear``: the rank-1 output, the masked LM's own logits), which the joint heads copy or
wrap as they do for the DiT. So the rank-1 view of an adapted model is the masked LM itself (tested to float
rounding). The architecture class comes from ``transformers``, built from the saved config only: no hub, and
``trust_remote_code`` is refused (a model whose code is not in ``transformers`` cannot be adapted).

Time conditioning: none, as the paper does for MDLM (the masked LM sees x_t only; ``sigma`` is ignored).
Ids: ttcore's layout (``ttcore.tokenizers.hf``: [MASK] last), mapped to the model's own ids on the way in.
"""

import json
from pathlib import Path

import torch
from torch import nn

from .dit import DiTConfig

PROBE_TOKENS = 16  # positions of the probe that reads the decoder's bias (any input gives the same bias)


class _Features(Exception):  # noqa: N818 - control flow, not an error: the decoder's input, caught in forward
    def __init__(self, h: torch.Tensor):
        super().__init__()
        self.h = h


class _StopAtDecoder(nn.Module):
    """Stands where the masked LM's decoder was: its input is the features; nothing after it runs."""

    def forward(self, h):
        raise _Features(h)


def _owner(root: nn.Module, module: nn.Module) -> tuple[nn.Module, str]:
    for name, parent in root.named_modules():
        for child_name, child in parent.named_children():
            if child is module:
                return parent, child_name
    raise ValueError("the masked LM's output embeddings are not one of its modules")


def build_masked_lm(model_type: str, config: dict):
    """The masked LM's architecture class from its config alone (random weights; the checkpoint fills them)."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    cfg = AutoConfig.for_model(model_type, **config)
    if getattr(cfg, "reference_compile", None) is None and hasattr(cfg, "reference_compile"):
        cfg.reference_compile = False  # ModernBERT would torch.compile its own layers
    return AutoModelForMaskedLM.from_config(cfg, trust_remote_code=False)


ESM_MASK_RATIO_TRAIN = 0.15 * 0.8  # ESM's token dropout: the share of [MASK] inputs in all its training runs


def esm_token_dropout(ids: torch.Tensor, embeddings: torch.Tensor, mask_id: int) -> torch.Tensor:
    """ESM's masked-input semantics (``token_dropout: true``, as every published ESM-2 config sets): [MASK]
    embeddings are zeroed and the rest scaled by (1 - 0.12) / (1 - the sequence's masked share), the way
    dropout scales at evaluation. ESM computes the scale as written, which is 0/0 = NaN when every position is
    masked, as every generation starts; the masked share here is at most (l - 1) / l, which changes nothing
    else (a fully masked sequence's embeddings are all zero, and zero times a finite scale is zero).
    ids [b, l], embeddings [b, l, d] -> [b, l, d]."""
    masked = ids == mask_id
    share = masked.float().mean(-1).clamp_max(1 - 1 / ids.shape[-1])
    scale = (1 - ESM_MASK_RATIO_TRAIN) / (1 - share)
    return (embeddings.masked_fill(masked[..., None], 0.0) * scale[:, None, None]).to(embeddings.dtype)


def _own_token_dropout(mlm: nn.Module) -> None:
    """An ESM with ``token_dropout``: its embeddings' own scaling (NaN on a fully masked input) is switched off
    and ``esm_token_dropout`` applied to the word embeddings' output instead, so the adapter owns the
    masked-input semantics of the model it adapts."""
    embeddings = getattr(getattr(mlm, "esm", None), "embeddings", None)
    if embeddings is None or not getattr(embeddings, "token_dropout", False):
        return
    embeddings.token_dropout = False
    mask_id = mlm.config.mask_token_id
    embeddings.word_embeddings.register_forward_hook(
        lambda module, args, out: esm_token_dropout(args[0], out, mask_id))


class HFBackbone(nn.Module):
    """``spec``: ``model_type``, the masked LM's ``config`` (a dict) and ``hf_ids`` (ttcore id -> the model's id).
    x_t [b, l] (ttcore ids) -> the features [b, l, d] the masked LM's decoder reads."""

    def __init__(self, spec: dict):
        super().__init__()
        self.mlm = build_masked_lm(spec["model_type"], spec["config"])
        _own_token_dropout(self.mlm)
        parent, name = _owner(self.mlm, self.mlm.get_output_embeddings())
        setattr(parent, name, _StopAtDecoder())  # W lives in ttcore's output layer (the checkpoint keeps one copy)
        self.register_buffer("hf_ids", torch.tensor(spec["hf_ids"], dtype=torch.long), persistent=False)

    def checkpointing_(self, on: bool = True) -> "HFBackbone":
        """Activation checkpointing, as the masked LM implements it (``gradient_checkpointing_enable``)."""
        if on:
            self.mlm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.mlm.gradient_checkpointing_disable()
        return self

    def forward(self, x_t: torch.Tensor) -> torch.Tensor:
        ids = self.hf_ids[x_t]
        try:
            self.mlm(input_ids=ids, attention_mask=torch.ones_like(ids))
        except _Features as f:
            return f.h
        raise RuntimeError("the masked LM returned without reading its decoder's input")


class MLMOutput(nn.Module):
    """The base head W of an adapted masked LM (its decoder: weight and bias), as ``FinalLayer.linear``; None
    when a 1-layer joint head replaces it."""

    def __init__(self, hidden_dim: int, out_vocab: int, with_linear: bool = True):
        super().__init__()
        self.linear = nn.Linear(hidden_dim, out_vocab) if with_linear else None


def is_hf_directory(path: str | Path) -> bool:
    """A local ``transformers`` model directory (config.json with a ``model_type``), not a ttcore checkpoint."""
    p = Path(path) / "config.json"
    if not p.is_file():
        return False
    try:
        config = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config and "format_version" not in config


def _refuse_remote_code(directory: Path, config: dict) -> None:
    if config.get("auto_map"):
        raise ValueError(f"{directory.name}'s config names custom code (auto_map: {sorted(config['auto_map'])}): "
                         "ttcore adapts only masked LMs that transformers implements itself, and never runs a "
                         "model's own code (trust_remote_code is refused)")


def load_masked_lm(directory: str | Path, length: int | None = None):
    """A local masked-LM directory as a rank-1 ``JointModel`` (its MLM decoder the base head W) and its
    tokenizer (``HFTokenizer``). ``length``: tokens per sequence (default: the model's position limit, at most
    512). No hub access: the directory's files only."""
    from transformers import AutoModelForMaskedLM

    from ttcore.tokenizers.hf import HFTokenizer

    from .joint_model import JointModel, ModelConfig

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    _refuse_remote_code(directory, config)
    mlm = AutoModelForMaskedLM.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    mlm.eval()
    cfg = mlm.config
    limit = getattr(cfg, "max_position_embeddings", 512) or 512
    length = length or min(512, limit)
    tok = HFTokenizer.from_pretrained(directory, length, n_ids=cfg.vocab_size)
    if tok.n_ids > cfg.vocab_size:
        raise ValueError(f"{directory.name}'s tokenizer has {tok.n_ids} tokens, more than the model's "
                         f"{cfg.vocab_size} embeddings")
    hf_ids = tok.hf_ids
    weight, bias = _decoder_map(mlm, hf_ids)
    spec = {"model_type": cfg.model_type, "config": _plain_config(cfg), "hf_ids": hf_ids}
    dit = DiTConfig(vocab_size=len(hf_ids), out_vocab=len(hf_ids) - 1, length=length, hidden_dim=weight.shape[1],
                    n_blocks=getattr(cfg, "num_hidden_layers", 0), n_heads=getattr(cfg, "num_attention_heads", 1))
    model = JointModel(ModelConfig(dit, backbone=spec, extra={"base": directory.name}))
    missing = model.backbone.mlm.load_state_dict(mlm.state_dict(), strict=False)
    unexpected = [k for k in missing.unexpected_keys if not _is_decoder_key(mlm, k)]
    if missing.missing_keys or unexpected:
        raise ValueError(f"{directory.name}: the adapted model's weights do not match ({missing})")
    with torch.no_grad():
        model.output_layer.linear.weight.copy_(weight)
        model.output_layer.linear.bias.copy_(bias)
    return model.eval(), tok


def _is_decoder_key(mlm, key: str) -> bool:
    out = mlm.get_output_embeddings()
    names = {f"{n}.{p}" for n, m in mlm.named_modules() if m is out for p in ("weight", "bias")}
    return key in names


def _plain_config(cfg) -> dict:
    """The config's own settings as JSON (what ``AutoConfig.for_model`` rebuilds it from)."""
    d = cfg.to_diff_dict() if hasattr(cfg, "to_diff_dict") else cfg.to_dict()
    return {k: v for k, v in json.loads(json.dumps(d, default=str)).items()
            if k not in ("model_type", "architectures", "transformers_version", "auto_map", "_name_or_path")}


@torch.no_grad()
def _decoder_map(mlm, hf_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked LM's last affine map (W h + b, b read off a probe: ESM adds its bias after the decoder) in
    ttcore's output order; refuses a head that is not affine after the decoder's input."""
    seen = {}
    out = mlm.get_output_embeddings()
    hook = out.register_forward_pre_hook(lambda module, args: seen.setdefault("h", args[0]))
    g = torch.Generator().manual_seed(0)
    probe = torch.randint(0, mlm.config.vocab_size, (1, PROBE_TOKENS), generator=g)
    try:
        logits = mlm(input_ids=probe, attention_mask=torch.ones_like(probe)).logits[0].double()
    finally:
        hook.remove()
    h = seen["h"][0].double()
    bias = logits - h @ out.weight.double().T  # [l, V]: the same row at every position for an affine map
    if not torch.allclose(bias, bias[:1].expand_as(bias), atol=1e-4, rtol=1e-4):
        raise ValueError(f"{type(mlm).__name__}'s logits are not an affine map of its decoder's input: "
                         "its MLM head cannot be ttcore's base head W")
    rows = torch.tensor(hf_ids[:-1])
    return out.weight[rows].clone(), bias[0].float()[rows]
