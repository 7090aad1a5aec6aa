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
