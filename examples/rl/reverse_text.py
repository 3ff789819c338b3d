"""The verifiable task: reverse a short random string of lowercase letters.

A prompt is `reverse: h e l l o\n`, the answer ` o l l e h` followed by EOS. note: the letters are spaced on
purpose: the default model's byte-level BPE (trained on Python) merges runs of letters into multi-letter tokens
("abc", "def"), which would make reversal a spelling puzzle for a 15M-parameter model; spaced, every letter is
one token (" a" .. " z"), and the task is a pure reverse-copy the model can learn in a few hundred SFT steps.
Random strings rather than words, so nothing can be memorised: the model must learn the algorithm.

Reward: the longest-common-subsequence ratio between the letters of the completion and the reversed string,
2 * LCS / (len(got) + len(want)) (difflib's ratio, in [0, 1]; partial credit gives GRPO a gradient before the
first exact answer). Pass: exact match.
"""

from __future__ import annotations

import random
import string

PREFIX = "reverse:"


def random_word(rng: random.Random, min_len: int = 3, max_len: int = 8) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(min_len, max_len)))


def spaced(word: str) -> str:
    return "".join(" " + c for c in word)


def prompt(word: str) -> str:
    return f"{PREFIX}{spaced(word)}\n"


def answer(word: str) -> str:
    """The SFT target text (EOS is appended as a token id by the caller)."""
    return spaced(word[::-1])


def letters(completion: str) -> str:
    """The completion as the model spelled it: spaces dropped, stops at the first newline."""
    return completion.split("\n", 1)[0].replace(" ", "")


def lcs_len(a: str, b: str) -> int:
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def reward(word: str, completion: str) -> tuple[float, bool]:
    """(LCS ratio in [0, 1], exact) of a completion's text for the prompt made from `word`."""
    got, want = letters(completion), word[::-1]
    if not got:
        return 0.0, False
    return 2.0 * lcs_len(got, want) / (len(got) + len(want)), got == want


def sft_pairs(tokenizer, eos_id: int, rng: random.Random, count: int,
              min_len: int = 3, max_len: int = 8) -> list[tuple[list[int], list[int]]]:
    """`count` (prompt ids, completion ids + EOS) pairs for supervised warm-up."""
    out = []
    for _ in range(count):
        w = random_word(rng, min_len, max_len)
        p = tokenizer.encode(prompt(w), add_special_tokens=False).ids
        c = tokenizer.encode(answer(w), add_special_tokens=False).ids + [eos_id]
        out.append((p, c))
    return out
