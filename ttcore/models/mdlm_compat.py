"""Load an official MDLM checkpoint (``kuleshov-group/mdlm-owt`` layout) into our JointModel.

The directory holds MDLM's Hugging Face files: ``config.json`` (hidden_dim, cond_dim, n_blocks,
n_heads, model_length, vocab_size, dropout, time_conditioning) and ``model.safetensors`` with keys
``backbone.vocab_embed.embedding``, ``backbone.sigma_map.mlp.*``, ``backbone.blocks.N.*`` and
``backbone.output_layer.*``. Our DiT uses the same module names under ``backbone.``; the output layer
moves to ``output_layer.`` and loses its [MASK] row (SUBS: never predicted). MDLM does not rotate
values, so ``rotary_values`` is off (the paper keeps that for its text models). No flash-attn needed:
attention is torch's scaled_dot_product_attention. Never reads pickle files.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .checkpoint import CheckpointError
from .dit import DiTConfig
from .joint_model import JointModel, ModelConfig

_REQUIRED = ("hidden_dim", "cond_dim", "n_blocks", "n_heads", "model_length", "vocab_size")


def is_mdlm_checkpoint(directory: str | Path) -> bool:
    path = Path(directory) / "config.json"
    if not path.exists():
        return False
    config = json.loads(path.read_text())
    return "format_version" not in config and all(k in config for k in _REQUIRED)


def mdlm_state_to_ours(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename MDLM's parameters to ours; drop the rotary buffer and the output row of [MASK]."""
    out = {}
    for key, value in state.items():
        if key.endswith("rotary_emb.inv_freq"):
            continue  # recomputed
        if key.startswith("backbone.output_layer."):
            name = key[len("backbone."):]
            if name in ("output_layer.linear.weight", "output_layer.linear.bias"):
                value = value[:-1]  # the last output is [MASK], which SUBS never predicts
            out[name] = value
        elif key.startswith("backbone."):
            out[key] = value
        else:
            raise CheckpointError(f"unexpected parameter {key!r} in an MDLM checkpoint")
    return out


def load_mdlm(directory: str | Path, length: int | None = None):
    """-> (JointModel (rank 1, eval mode), GPT-2 TextTokenizer). ``length`` overrides model_length."""
    from ttcore.tokenizers.text import gpt2_bpe

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise CheckpointError(f"{directory}/config.json is not an MDLM config: missing {missing}")
    weights = directory / "model.safetensors"
    if not weights.exists():
        raise CheckpointError(f"{directory}: model.safetensors is missing (pickle checkpoints such as "
                              "pytorch_model.bin are not loaded; convert them to safetensors first)")
    if config.get("time_conditioning", False):
        raise CheckpointError(f"{directory.name}: time_conditioning is true, which ttcore does not support (its "
                              "samplers and scores feed the network no time, as mdlm-owt expects)")
    length = length or int(config["model_length"])
    dit = DiTConfig(vocab_size=int(config["vocab_size"]), out_vocab=int(config["vocab_size"]) - 1, length=length,
                    hidden_dim=int(config["hidden_dim"]), cond_dim=int(config["cond_dim"]),
                    n_blocks=int(config["n_blocks"]), n_heads=int(config["n_heads"]),
                    dropout=float(config.get("dropout", 0.0)),
                    time_conditioning=bool(config.get("time_conditioning", False)), rotary_values=False)
    model = JointModel(ModelConfig(dit, extra={"family": "text", "source": "mdlm"}))
    state = mdlm_state_to_ours(load_file(str(weights)))
    try:
        model.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as e:
        raise CheckpointError(f"{directory}: weights do not fit the MDLM config ({e})") from None
    tokenizer = gpt2_bpe(length)
    if tokenizer.vocab_size != dit.out_vocab:
        raise CheckpointError(f"{directory}: vocab_size {config['vocab_size']} does not match GPT-2's "
                              f"{tokenizer.vocab_size} tokens + [MASK]")
    return model.eval(), tokenizer
