"""An MDLM-OWT-layout checkpoint (scaled down, random) loads into our DiT and computes MDLM's logits,
checked against an independent plain-torch forward of MDLM's architecture over the raw weights."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ttcore.models import CheckpointError
from ttcore.models.dit import DiT, DiTConfig
from ttcore.models.mdlm_compat import is_mdlm_checkpoint, load_mdlm

CFG = dict(hidden_dim=64, cond_dim=16, n_blocks=2, n_heads=4, model_length=32, vocab_size=50258, dropout=0.1,
           time_conditioning=False)


def _write_mdlm(path):
    g = torch.Generator().manual_seed(0)
    d, c, v = CFG["hidden_dim"], CFG["cond_dim"], CFG["vocab_size"]
    r = lambda *s: 0.05 * torch.randn(*s, generator=g)  # noqa: E731
    state = {"backbone.vocab_embed.embedding": r(v, d), "backbone.sigma_map.mlp.0.weight": r(c, 256),
             "backbone.sigma_map.mlp.0.bias": r(c), "backbone.sigma_map.mlp.2.weight": r(c, c),
             "backbone.sigma_map.mlp.2.bias": r(c),
             "backbone.rotary_emb.inv_freq": 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16),
             "backbone.output_layer.norm_final.weight": 1 + r(d), "backbone.output_layer.linear.weight": r(v, d),
             "backbone.output_layer.linear.bias": r(v), "backbone.output_layer.adaLN_modulation.weight": r(2 * d, c),
             "backbone.output_layer.adaLN_modulation.bias": r(2 * d)}
    for n in range(CFG["n_blocks"]):
        p = f"backbone.blocks.{n}."
        state.update({p + "norm1.weight": 1 + r(d), p + "attn_qkv.weight": r(3 * d, d), p + "attn_out.weight": r(d, d),
                      p + "norm2.weight": 1 + r(d), p + "mlp.0.weight": r(4 * d, d), p + "mlp.0.bias": r(4 * d),
                      p + "mlp.2.weight": r(d, 4 * d), p + "mlp.2.bias": r(d),
                      p + "adaLN_modulation.weight": r(6 * d, c), p + "adaLN_modulation.bias": r(6 * d)})
    path.mkdir()
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(dict(CFG, model_type="mdlm", architectures=["MDLM"])))
    return state


def _reference_logits(state, x):
    """MDLM's DIT forward, written out from its architecture: q/k rotary only, no value rotation."""
    d, h = CFG["hidden_dim"], CFG["n_heads"]
    ln = lambda t, w: F.layer_norm(t, [d]) * w  # noqa: E731
    half = 128
    freqs = torch.exp(-math.log(10000) * torch.arange(half).float() / half)
    args = torch.zeros(x.shape[0], 1) * freqs[None]
    emb = torch.cat([args.cos(), args.sin()], -1)
    s = state
    c = F.silu(F.linear(F.silu(F.linear(emb, s["backbone.sigma_map.mlp.0.weight"], s["backbone.sigma_map.mlp.0.bias"])),
                        s["backbone.sigma_map.mlp.2.weight"], s["backbone.sigma_map.mlp.2.bias"]))
    t = s["backbone.vocab_embed.embedding"][x]
    b, l = x.shape
    pos = torch.arange(l).float()[:, None] * s["backbone.rotary_emb.inv_freq"][None]
    cos, sin = torch.cat([pos, pos], -1).cos()[:, None], torch.cat([pos, pos], -1).sin()[:, None]  # [l, 1, hd]
    rot = lambda q: q * cos + torch.cat([-q[..., q.shape[-1] // 2:], q[..., : q.shape[-1] // 2]], -1) * sin  # noqa
    for n in range(CFG["n_blocks"]):
        p = f"backbone.blocks.{n}."
        mod = F.linear(c, s[p + "adaLN_modulation.weight"], s[p + "adaLN_modulation.bias"])[:, None].chunk(6, 2)
        y = ln(t, s[p + "norm1.weight"]) * (1 + mod[1]) + mod[0]
        qkv = F.linear(y, s[p + "attn_qkv.weight"]).view(b, l, 3, h, d // h)
        q, k, v = rot(qkv[:, :, 0]).transpose(1, 2), rot(qkv[:, :, 1]).transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), -1) @ v
        t = t + mod[2] * F.linear(att.transpose(1, 2).reshape(b, l, d), s[p + "attn_out.weight"])
        y = ln(t, s[p + "norm2.weight"]) * (1 + mod[4]) + mod[3]
        y = F.linear(F.gelu(F.linear(y, s[p + "mlp.0.weight"], s[p + "mlp.0.bias"]), approximate="tanh"),
                     s[p + "mlp.2.weight"], s[p + "mlp.2.bias"])
        t = t + mod[5] * y
    o = "backbone.output_layer."
    shift, scale = F.linear(c, s[o + "adaLN_modulation.weight"], s[o + "adaLN_modulation.bias"])[:, None].chunk(2, 2)
    y = ln(t, s[o + "norm_final.weight"]) * (1 + scale) + shift
    return F.linear(y, s[o + "linear.weight"], s[o + "linear.bias"])


def test_mdlm_owt_layout_loads_and_matches_reference(tmp_path):
    state = _write_mdlm(tmp_path / "mdlm-owt")
    assert is_mdlm_checkpoint(tmp_path / "mdlm-owt")
    model, tok = load_mdlm(tmp_path / "mdlm-owt")
    assert tok.mask_id == 50257 and tok.vocab_size == 50257 and not model.cfg.dit.rotary_values
    x = torch.randint(0, 50258, (2, 32), generator=torch.Generator().manual_seed(1))
    x[:, ::3] = tok.mask_id
    with torch.no_grad():
        ours = model.output_layer.linear(model.features(x))
        ref = _reference_logits(state, x)
    torch.testing.assert_close(ours, ref[..., :-1], rtol=1e-4, atol=1e-4)


def test_pickle_only_or_broken_mdlm_checkpoint_is_refused(tmp_path):
    _write_mdlm(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").rename(tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle checkpoints"):
        load_mdlm(tmp_path / "m")


def test_a_time_conditioned_checkpoint_is_refused_with_the_reason(tmp_path):
    """Its logits would come from the wrong time (the review measured about 2 off): refused, not served."""
    _write_mdlm(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(config, time_conditioning=True)))
    with pytest.raises(CheckpointError, match="time_conditioning"):
        load_mdlm(tmp_path / "m")
    with pytest.raises(ValueError, match="time_conditioning"):
        DiTConfig(vocab_size=5, out_vocab=4, length=3, time_conditioning=True)


def test_attention_has_no_dropout_as_in_mdlm():
    """MDLM passes dropout 0 to its attention and drops out the residual branches only; ttcore applied
    its dropout inside attention too, so fine-tuning an MDLM checkpoint trained another network. Every
    attention call of a training-mode forward is observed (a TorchFunctionMode sees the real calls)."""
    from torch.overrides import TorchFunctionMode

    class Observe(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.dropout_p = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                self.dropout_p.append(kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0))
            return func(*args, **kwargs)

    torch.manual_seed(0)
    dit = DiT(DiTConfig(vocab_size=9, out_vocab=8, length=6, hidden_dim=16, cond_dim=8, n_blocks=2, n_heads=2,
                        dropout=0.1)).train()
    with Observe() as seen:
        train = dit(torch.randint(0, 9, (2, 6)))[0]
    assert seen.dropout_p == [0.0, 0.0]
    torch.manual_seed(0)
    assert not torch.equal(train, dit.eval()(torch.randint(0, 9, (2, 6)))[0])  # the residual dropout is still there
