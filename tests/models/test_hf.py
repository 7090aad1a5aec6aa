"""A transformers masked LM as the backbone (``ttcore.models.hf``): the rank-1 view of the adapted model is the
masked LM itself, the joint heads' math holds on it (against enumeration), and what cannot be adapted is refused
with its reason. Tiny random models of four architectures, written with ``save_pretrained`` (no hub)."""

import itertools
import json

import pytest
import torch

pytest.importorskip("transformers")
from ttcore.models import JointModel, load_checkpoint, save_checkpoint  # noqa: E402
from ttcore.models.hf import load_masked_lm  # noqa: E402
from ttcore.models.hf_random import KINDS, write_random_masked_lm  # noqa: E402

L = 12


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {kind: write_random_masked_lm(kind, root / kind) for kind in KINDS}


def _masked_input(tok, text="MKTAYIAK"):
    x = torch.tensor([tok.encode(text), tok.encode(text[::-1])])
    x[0, 2:5] = tok.mask_id
    x[1, 1::3] = tok.mask_id
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_the_rank_one_view_is_the_masked_lms_own_logits(directories, kind):
    from transformers import AutoModelForMaskedLM

    model, tok = load_masked_lm(directories[kind], length=L)
    hf = AutoModelForMaskedLM.from_pretrained(directories[kind], local_files_only=True).eval()
    x = _masked_input(tok)
    mask = x == tok.mask_id
    with torch.no_grad():
        ours = model(x, mask).logits  # the rank-1 head outputs on the masked positions, ttcore's vocabulary order
        theirs = hf(input_ids=torch.tensor([tok.to_hf(row) for row in x.tolist()]),
                    attention_mask=torch.ones_like(x)).logits[mask][:, tok.hf_ids[:-1]]
    assert ours.shape == (int(mask.sum()), tok.vocab_size) and theirs.abs().max() > 1
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert tok.decode(tok.encode("MKTAYIAK")) == "MKTAYIAK"  # the model's own tokenizer, in ttcore's layout


def test_esm_with_its_published_token_dropout_is_finite_on_fully_masked_input(directories):
    """ESM-2's published configs set ``token_dropout: true``: ESM's own forward then divides by (1 - masked share),
    NaN on a fully masked input (as every generation starts, and about 1/(l+1) of training rows). The adapter
    owns those semantics: the masked LM's logits where ESM is finite (above), finite features, a finite first
    step's distribution and loss where it is not."""
    from transformers import AutoModelForMaskedLM

    from ttcore.losses import mdlm_loss
    from ttcore.models.hf import ESM_MASK_RATIO_TRAIN, esm_token_dropout

    assert json.loads((directories["esm"] / "config.json").read_text())["token_dropout"] is True
    model, tok = load_masked_lm(directories["esm"], length=L)
    hf = AutoModelForMaskedLM.from_pretrained(directories["esm"], local_files_only=True).eval()
    x = torch.full((2, L), tok.mask_id)
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([tok.to_hf(row) for row in x.tolist()]),
                    attention_mask=torch.ones_like(x)).logits
        assert torch.isnan(theirs).all()  # what the adapter must not inherit
        out = model(x, x == tok.mask_id)
        assert torch.isfinite(out.logits).all()
        # a fully masked input's embeddings are zero whatever the scale: the logits are ESM's own on zero embeddings
        zero = hf(inputs_embeds=torch.zeros(2, L, hf.config.hidden_size), attention_mask=torch.ones_like(x)).logits
        torch.testing.assert_close(out.logits, zero.flatten(0, 1)[:, tok.hf_ids[:-1]], rtol=1e-5, atol=1e-5)
    x0 = torch.tensor([tok.encode("MKTAYIAK")] * 2)
    loss = mdlm_loss(model, x0, tok.mask_id, t=torch.ones(2), mask=torch.ones_like(x0, dtype=torch.bool))
    assert torch.isfinite(loss["loss"])
    # the scale, where ESM's own is finite: (1 - 0.12) / (1 - share)
    ids, emb = torch.tensor([[5, 0, 0, 7]]), torch.ones(1, 4, 3)
    scaled = esm_token_dropout(ids, emb, mask_id=0)
    assert scaled[0, 1].abs().sum() == 0 and scaled[0, 0, 0] == pytest.approx((1 - ESM_MASK_RATIO_TRAIN) / 0.5)


@pytest.mark.parametrize("kind", ["modernbert", "esm"])
@pytest.mark.parametrize("decomposition,rank", [("tt", 2), ("cp", 3)])
def test_joint_heads_on_an_adapted_backbone_match_enumeration(directories, kind, decomposition, rank):
    """Zero noise: the joint keeps the masked LM's marginals; with noise, the joint over two masked positions
    sums to one and scores each pair as the enumerated product of its normalized factors does."""
    base, tok = load_masked_lm(directories[kind], length=L)
    x = torch.tensor([tok.encode("GFLIVKR")])
    x[0, [2, 5]] = tok.mask_id
    mask = x == tok.mask_id
    same = JointModel.from_base(base, decomposition, rank, noise=0.0).eval()
    with torch.no_grad():
        free = torch.full_like(x, -1)
        torch.testing.assert_close(same(x, mask).joint(x).marginals(free).double(),
                                   base(x, mask).joint(x).marginals(free).double(), rtol=1e-5, atol=1e-6)
    joint = JointModel.from_base(base, decomposition, rank, noise=0.5, generator=torch.Generator().manual_seed(0))
    joint = joint.double().eval()
    with torch.no_grad():
        out = joint(x, mask)
    v = tok.vocab_size
    pairs = torch.tensor(list(itertools.product(range(v), repeat=2)))  # every value of the two masked positions
    x0 = x.repeat(len(pairs), 1)
    x0[:, 2], x0[:, 5] = pairs[:, 0], pairs[:, 1]
    rows = {name: getattr(out, name) for name in ("core_logits", "factor_logits", "contracted_logits",
                                                  "weight_logits") if hasattr(out, name)}
    expanded = type(out)(mask.repeat(len(pairs), 1), **{
        k: t.repeat(len(pairs), *[1] * (t.dim() - 1)) if k not in ("weight_logits",) else t.repeat(len(pairs), 1)
        for k, t in rows.items()})
    log_p = expanded.log_prob(x0)
    assert abs(float(log_p.exp().sum()) - 1) < 1e-9  # a normalized joint over V^2 pairs
    assert torch.isfinite(out.auxiliary_loss())


def test_an_adapted_model_saves_and_loads_as_a_ttcore_checkpoint(directories, tmp_path):
    """The checkpoint holds the masked LM's config and weights (its decoder once, as the base head W); loading
    builds the architecture class from transformers and gives the same outputs."""
    model, tok = load_masked_lm(directories["bert"], length=L)
    joint = JointModel.from_base(model, "tt", 2, noise=0.3, generator=torch.Generator().manual_seed(0)).eval()
    save_checkpoint(tmp_path / "ckpt", joint, tok)
    again, tok2, config = load_checkpoint(tmp_path / "ckpt")
    assert config["model"]["backbone"]["model_type"] == "bert" and tok2.kind == "hf"
    x = _masked_input(tok2)
    with torch.no_grad():
        torch.testing.assert_close(again(x, x == tok2.mask_id).core_logits, joint(x, x == tok.mask_id).core_logits)


def test_what_cannot_be_adapted_is_refused_with_its_reason(directories, tmp_path):
    import shutil

    remote = tmp_path / "remote"
    shutil.copytree(directories["bert"], remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForMaskedLM": "modeling_mine.MyModel"}
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code is refused"):
        load_masked_lm(remote)
    bare = tmp_path / "bare"
    shutil.copytree(directories["bert"], bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_masked_lm(bare)


@pytest.mark.parametrize("kind", ["bert", "esm"])
def test_activation_checkpointing_of_an_adapted_backbone_keeps_the_gradient(directories, kind):
    from ttcore.losses import mdlm_loss

    def gradient(checkpointing: bool) -> torch.Tensor:
        model, tok = load_masked_lm(directories[kind], length=L)
        model.backbone.checkpointing_(checkpointing)
        model.train()  # the masked LM's own dropout is on: the same seed, the same masks (recomputed ones too)
        torch.manual_seed(0)
        x0 = torch.tensor([tok.encode("GFLIVKR"), tok.encode("MKTAYIAK")] * 4)
        mdlm_loss(model, x0, tok.mask_id, generator=torch.Generator().manual_seed(0))["loss"].backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    plain, recomputed = gradient(False), gradient(True)
    assert plain.abs().max() > 0
    torch.testing.assert_close(recomputed, plain, rtol=1e-5, atol=1e-7)
