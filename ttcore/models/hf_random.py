"""Random masked LMs of four architectures (BERT, RoBERTa, ESM, ModernBERT), each written with ``save_pretrained``
and a tokenizer built here, as a user's local ``transformers`` directory would be (no hub): what the adapter's
tests and its benchmark (``benchmarks/hf_adapter.py``) start from."""

from pathlib import Path

AMINO = list("LAGVSERTIDPKQNFYMHWC")
SYMBOLS = AMINO + [c for c in "CNOSFclnos()[]=#123456+-@H" if c not in AMINO]  # peptides and SMILES
KINDS = ("bert", "roberta", "esm", "modernbert")


def _word_level_tokenizer(tokens: list[str], specials: dict[str, str]):
    """A fast tokenizer that reads one character a token (BERT- / RoBERTa- / ModernBERT-style specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(list(specials.values()) + tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()  # characters joined as they were
    return PreTrainedTokenizerFast(tokenizer_object=core, **specials)


def write_random_masked_lm(kind: str, directory: Path, hidden: int = 32, layers: int = 2, heads: int = 2,
                           seed: int = 0, spread: float = 0.2, token_dropout: bool = True) -> Path:
    """A random ``kind`` (bert, roberta, esm, modernbert) masked LM with its tokenizer, saved to ``directory``;
    ``spread``: noise added to the initial weights (a fresh init's logits are nearly flat). An ESM is configured
    as the published ESM-2 checkpoints are (rotary positions, ``token_dropout``, no embedding layer norm)."""
    import torch
    from transformers import AutoModelForMaskedLM, BertConfig, EsmConfig, EsmTokenizer, ModernBertConfig, RobertaConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arch = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=(4 if hidden > 64 else 2) * hidden, max_position_embeddings=80)
    if kind == "esm":
        vocab = ["<cls>", "<pad>", "<eos>", "<unk>", *AMINO, "<mask>"]
        (directory / "vocab.txt").write_text("\n".join(vocab))
        tok = EsmTokenizer(str(directory / "vocab.txt"))
        config = EsmConfig(vocab_size=len(vocab), pad_token_id=1, mask_token_id=len(vocab) - 1,
                           position_embedding_type="rotary", token_dropout=token_dropout,
                           emb_layer_norm_before=False, **arch)
    else:
        names = {"bert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
                 "roberta": ("<pad>", "<unk>", "<s>", "</s>", "<mask>"),
                 "modernbert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}[kind]
        specials = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), names))
        tok = _word_level_tokenizer(SYMBOLS, specials)
        ids = dict(pad_token_id=0, vocab_size=len(tok))
        if kind == "bert":
            config = BertConfig(**ids, **arch)
        elif kind == "roberta":
            config = RobertaConfig(**ids, bos_token_id=2, eos_token_id=3, **dict(arch, max_position_embeddings=84))
        else:
            config = ModernBertConfig(**ids, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
                                      global_attn_every_n_layers=1, **arch)
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(spread * torch.randn_like(p))
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
