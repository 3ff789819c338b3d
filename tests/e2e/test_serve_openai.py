"""`mxq serve` through the official `openai` client (a client nobody here wrote), field by field against OpenAI's
API and vLLM's extensions (vllm/entrypoints/openai/{completion,chat_completion}/protocol.py and serving.py):
completions with every prompt form and sampling field, chat completions with mxq's Qwen3 template, streaming ==
non-streaming, greedy == `mxq generate`, n > 1 with a seed, token-id returns, stops, EOS, usage, weight_version.
Temperature is always given: like vLLM, a request without one samples at 1.0 (generation_config.json of the
default model sets no temperature)."""
import json
import re
import time

import openai
import pytest

from serve_fixtures import (EOS, MAX_MODEL_LEN, decode, encode, mxq_generate, qwen3_chat, tokenizer)

PROMPT = "def fibonacci(n):\n"
PROMPT2 = "import os\nimport sys\n\n\ndef main():\n"
USER = "Write a function that adds two numbers."


def extra(obj, name):
    """A field outside OpenAI's schema (vLLM/mxq extensions) as the openai client keeps it."""
    return (getattr(obj, "model_extra", None) or {}).get(name, getattr(obj, name, None))


def comp(client, model, **kw):
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", 16)
    eb = kw.pop("extra_body", {})
    for k in ("return_token_ids", "ignore_eos", "top_k", "min_p", "stop_token_ids", "include_stop_str_in_output",
              "skip_special_tokens", "return_tokens_as_token_ids"):
        if k in kw:
            eb[k] = kw.pop(k)
    return client.completions.create(model=model, extra_body=eb or None, **kw)


def chat(client, model, messages, **kw):
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", 16)
    if kw["max_tokens"] is None:
        del kw["max_tokens"]
    eb = kw.pop("extra_body", {})
    for k in ("return_token_ids", "ignore_eos", "top_k", "chat_template_kwargs", "add_generation_prompt",
              "return_tokens_as_token_ids"):
        if k in kw:
            eb[k] = kw.pop(k)
    return client.chat.completions.create(model=model, messages=messages, extra_body=eb or None, **kw)


def close(a, b, tol=1e-4):
    return abs(a - b) <= tol


# --- /v1/models ---------------------------------------------------------------------------------------------
def test_models_lists_the_served_model(client, server):
    page = client.models.list()
    assert len(page.data) == 1
    m = page.data[0]
    assert m.object == "model" and isinstance(m.id, str) and m.id
    assert m.id == "default"  # no MODEL_DIR, no --served-model-name
    assert isinstance(extra(m, "root"), str) and extra(m, "root")
    assert extra(m, "max_model_len") == MAX_MODEL_LEN
    assert isinstance(m.created, int) and isinstance(m.owned_by, str)
    status, _, data = server.get("/v1/models")
    assert status == 200 and json.loads(data)["object"] == "list"


# --- completions: fields ------------------------------------------------------------------------------------
def test_completion_has_every_openai_field(client, model):
    t0 = time.time()
    r = comp(client, model, prompt=PROMPT, max_tokens=8, ignore_eos=True)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == model
    assert abs(r.created - t0) < 300
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and isinstance(c.text, str) and c.logprobs is None
    assert c.finish_reason == "length" and extra(c, "stop_reason") is None
    assert r.usage.prompt_tokens == len(encode(PROMPT))
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert extra(r, "weight_version") == "0"
    # without return_token_ids there are no token ids (vLLM leaves them out / null)
    assert extra(c, "token_ids") is None and extra(c, "prompt_token_ids") is None


def test_model_may_be_omitted_but_not_wrong(server, model):
    r = server.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
    assert r["model"] == model
    status, _, data = server.post("/v1/completions", {"model": "no-such-model", "prompt": "x", "max_tokens": 2})
    assert status == 404, data  # vLLM: NotFoundError "The model `no-such-model` does not exist."


@pytest.mark.parametrize("prompt", [PROMPT, PROMPT2])
def test_greedy_completion_equals_mxq_generate(client, model, prompt):
    ref = mxq_generate(prompt, max_new_tokens=24, top_logprobs=2)
    r = comp(client, model, prompt=prompt, max_tokens=24, logprobs=2, return_token_ids=True)
    c = r.choices[0]
    assert extra(c, "token_ids") == ref["token_ids"]
    assert c.text == ref["text"]
    assert c.finish_reason == ref["finish_reason"]
    assert extra(c, "prompt_token_ids") == encode(prompt)
    for got, want in zip(c.logprobs.token_logprobs, ref["logprobs"], strict=True):
        assert close(got, want["logprob"]), (got, want)


def test_greedy_token_id_prompt_equals_mxq_generate(client, model):
    ids = encode(PROMPT2)
    ref = mxq_generate(prompt_ids=ids, max_new_tokens=16, ignore_eos=True)
    r = comp(client, model, prompt=ids, max_tokens=16, ignore_eos=True, return_token_ids=True)
    assert extra(r.choices[0], "token_ids") == ref["token_ids"]
    assert r.usage.prompt_tokens == len(ids)


def test_every_prompt_form(client, model):
    singles = {p: comp(client, model, prompt=p, max_tokens=8, return_token_ids=True).choices[0]
               for p in (PROMPT, PROMPT2)}
    forms = [[PROMPT, PROMPT2], [encode(PROMPT), encode(PROMPT2)]]
    for form in forms:
        r = comp(client, model, prompt=form, max_tokens=8, return_token_ids=True)
        assert [c.index for c in r.choices] == [0, 1]
        for c, p in zip(r.choices, (PROMPT, PROMPT2)):
            assert extra(c, "token_ids") == extra(singles[p], "token_ids") and c.text == singles[p].text
            # vLLM puts prompt_token_ids on each completion choice (CompletionResponseChoice.prompt_token_ids)
            assert extra(c, "prompt_token_ids") == encode(p)
        assert r.usage.prompt_tokens == len(encode(PROMPT)) + len(encode(PROMPT2))
        assert r.usage.completion_tokens == sum(len(extra(c, "token_ids")) for c in r.choices)
    r = comp(client, model, prompt=encode(PROMPT), max_tokens=8, return_token_ids=True)
    assert extra(r.choices[0], "token_ids") == extra(singles[PROMPT], "token_ids")


# --- completions: sampling ----------------------------------------------------------------------------------
def test_n_with_seed_choice_i_equals_n1_with_seed_plus_i(client, model):
    r = comp(client, model, prompt=PROMPT, n=3, seed=1234, temperature=1.0, max_tokens=12, ignore_eos=True,
             return_token_ids=True)
    assert [c.index for c in r.choices] == [0, 1, 2]
    seqs = [extra(c, "token_ids") for c in r.choices]
    for i, c in enumerate(r.choices):
        one = comp(client, model, prompt=PROMPT, seed=1234 + i, temperature=1.0, max_tokens=12, ignore_eos=True,
                   return_token_ids=True).choices[0]
        assert extra(one, "token_ids") == seqs[i] and one.text == c.text, i
    assert len({tuple(s) for s in seqs}) >= 2  # three T=1 samples of 12 tokens are not all equal
    # OpenAI/vLLM count the prompt once per prompt, not once per sample
    assert r.usage.prompt_tokens == len(encode(PROMPT))
    assert r.usage.completion_tokens == 36


def test_seeded_sampling_equals_mxq_generate_and_repeats(client, model):
    ref = mxq_generate(PROMPT, max_new_tokens=16, temperature=0.8, seed=7, ignore_eos=True)
    a = comp(client, model, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=7, ignore_eos=True,
             return_token_ids=True).choices[0]
    b = comp(client, model, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=7, ignore_eos=True,
             return_token_ids=True).choices[0]
    assert extra(a, "token_ids") == ref["token_ids"]
    assert extra(b, "token_ids") == extra(a, "token_ids")


def test_degenerate_filters_sample_the_greedy_token(client, model):
    greedy = extra(comp(client, model, prompt=PROMPT2, max_tokens=12, return_token_ids=True).choices[0],
                   "token_ids")
    for kw in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        got = comp(client, model, prompt=PROMPT2, max_tokens=12, temperature=1.0, seed=5, return_token_ids=True,
                   **kw).choices[0]
        assert extra(got, "token_ids") == greedy, kw


def test_logprobs_are_of_the_raw_distribution(client, model):
    # vLLM's default logprobs mode is raw_logprobs: the model's distribution before temperature/top-k/top-p, so
    # the first position's top logprobs do not depend on the sampling parameters.
    g = comp(client, model, prompt=PROMPT, max_tokens=1, logprobs=5, return_tokens_as_token_ids=True).choices[0]
    s = comp(client, model, prompt=PROMPT, max_tokens=1, logprobs=5, temperature=0.5, top_k=3, seed=11,
             return_tokens_as_token_ids=True).choices[0]
    gt, st = g.logprobs.top_logprobs[0], s.logprobs.top_logprobs[0]
    for tok in set(gt) & set(st):
        assert close(gt[tok], st[tok]), (tok, gt[tok], st[tok])
    assert len(set(gt) & set(st)) >= 5
    sampled = s.logprobs.tokens[0]
    assert sampled in gt, (sampled, gt)  # top_k = 3 samples inside the raw top 5
    assert close(s.logprobs.token_logprobs[0], gt[sampled])


def test_completion_logprobs_format(client, model):
    r = comp(client, model, prompt=PROMPT, max_tokens=6, logprobs=3, ignore_eos=True, return_token_ids=True)
    c = r.choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset[0] == 0
    for i in range(1, 6):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])
    for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert isinstance(tok, str) and tlp <= 0
        # OpenAI: the top `logprobs` alternatives plus the sampled token (vLLM: up to logprobs + 1 entries)
        assert 1 <= len(top) <= 4 and tok in top
        assert close(max(top.values()), tlp)  # greedy picked the best raw token
        assert close(top[tok], tlp)
    assert "".join(lp.tokens) == c.text
    assert [decode([t]) for t in extra(c, "token_ids")] == lp.tokens


def test_return_tokens_as_token_ids(client, model):
    r = comp(client, model, prompt=PROMPT, max_tokens=5, logprobs=2, ignore_eos=True, return_token_ids=True,
             return_tokens_as_token_ids=True)
    c = r.choices[0]
    assert c.logprobs.tokens == [f"token_id:{t}" for t in extra(c, "token_ids")]
    for top in c.logprobs.top_logprobs:
        assert all(re.fullmatch(r"token_id:\d+", k) for k in top) and 2 <= len(top) <= 3


def test_echo_prepends_the_prompt(client, model):
    plain = comp(client, model, prompt=PROMPT, max_tokens=6).choices[0].text
    r = comp(client, model, prompt=PROMPT, max_tokens=6, echo=True)
    assert r.choices[0].text == PROMPT + plain
    ids = encode(PROMPT2)
    r = comp(client, model, prompt=ids, max_tokens=6, echo=True)
    assert r.choices[0].text.startswith(decode(ids))


def test_echo_with_logprobs_is_prompt_logprobs_or_a_clean_400(client, model):
    ids = encode(PROMPT)
    try:
        r = comp(client, model, prompt=ids, max_tokens=4, echo=True, logprobs=1, ignore_eos=True,
                 return_tokens_as_token_ids=True)
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        msg = str(body.get("message", "")) + str(body.get("param", "")) + str(e)
        assert "echo" in msg and "logprobs" in msg, msg  # refused by name
        return
    plain = comp(client, model, prompt=ids, max_tokens=4, logprobs=1, ignore_eos=True,
                 return_tokens_as_token_ids=True).choices[0].logprobs
    lp = r.choices[0].logprobs
    # vLLM: prompt tokens then generated ones; the first prompt token has no logprob (None, None top)
    assert lp.tokens == [f"token_id:{t}" for t in ids] + plain.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    for a, b in zip(lp.token_logprobs[len(ids):], plain.token_logprobs, strict=True):
        assert close(a, b)
    # log P(ids[1] | ids[0]) is the logprob a 1-token request on ids[:1] gives that token
    one = comp(client, model, prompt=ids[:1], max_tokens=1, logprobs=20, return_tokens_as_token_ids=True)
    top = one.choices[0].logprobs.top_logprobs[0]
    if f"token_id:{ids[1]}" in top:
        assert close(lp.token_logprobs[1], top[f"token_id:{ids[1]}"])


# --- completions: stops, EOS ---------------------------------------------------------------------------------
def _greedy(client, model, prompt, n=24, **kw):
    c = comp(client, model, prompt=prompt, max_tokens=n, ignore_eos=True, return_token_ids=True, **kw).choices[0]
    return c.text, extra(c, "token_ids")


def _stop_string(text):
    for p in range(4, len(text) - 2):
        s = text[p:p + 2]
        if s.strip() and text.find(s) == p:
            return p, s
    pytest.fail(f"no usable stop string in {text!r}")


def test_stop_strings(client, model):
    text, _ = _greedy(client, model, PROMPT2)
    p, s = _stop_string(text)
    for stop in (s, [s], ["\x00never\x00", s]):
        c = comp(client, model, prompt=PROMPT2, max_tokens=24, ignore_eos=True, stop=stop).choices[0]
        assert c.text == text[:p], (stop, c.text, text)
        assert c.finish_reason == "stop" and extra(c, "stop_reason") == s
    c = comp(client, model, prompt=PROMPT2, max_tokens=24, ignore_eos=True, stop=[s],
             include_stop_str_in_output=True).choices[0]
    assert c.text == text[:p + len(s)] and c.finish_reason == "stop" and extra(c, "stop_reason") == s
    # streamed: the held-back text never leaks past the stop string
    chunks = list(comp(client, model, prompt=PROMPT2, max_tokens=24, ignore_eos=True, stop=[s], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text[:p]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"


def test_stop_token_ids(client, model):
    text, ids = _greedy(client, model, PROMPT2)
    j = next((j for j in range(2, len(ids)) if ids.index(ids[j]) == j), None)
    assert j is not None, f"every greedy token repeats an earlier one: {ids}"
    c = comp(client, model, prompt=PROMPT2, max_tokens=24, ignore_eos=True, stop_token_ids=[ids[j]],
             return_token_ids=True)
    ch = c.choices[0]
    assert extra(ch, "token_ids") == ids[:j + 1]  # vLLM keeps the stop token in the output ids
    assert ch.finish_reason == "stop" and extra(ch, "stop_reason") == ids[j]
    assert ch.text == decode(ids[:j])  # ... but not in the text
    assert c.usage.completion_tokens == j + 1


# note: the default model (trained on whole Python files joined by <|endoftext|>) ends a script after its
# `if __name__ == "__main__": main()` block; the first candidate gives 8 tokens then EOS on the CPU MXFP8 model.
EOS_CANDIDATES = [
    encode('import os\n\n\ndef main():\n    print(os.getcwd())\n\n\nif __name__'),
    encode('import os\n\n\ndef main():\n    print(os.getcwd())\n\n\nif __name__ == "__main__":\n'),
    encode('__all__ = ["a", "b"'),
]


def _eos_prompt(client, model):
    r = comp(client, model, prompt=EOS_CANDIDATES, max_tokens=64, return_token_ids=True)
    for c, p in zip(r.choices, EOS_CANDIDATES):
        if c.finish_reason == "stop" and extra(c, "token_ids")[-1] == EOS:
            return p, extra(c, "token_ids"), c
    pytest.fail("no candidate prompt reaches EOS within 64 greedy tokens: %s" %
                [(c.finish_reason, extra(c, "token_ids")) for c in r.choices])


def test_eos_stops_and_ignore_eos_continues(client, model):
    prompt, ids, c = _eos_prompt(client, model)
    k = len(ids)
    assert extra(c, "stop_reason") is None  # EOS: stop, stop_reason null (vLLM)
    assert c.text == decode(ids[:-1]) and "<|endoftext|>" not in c.text
    ref = mxq_generate(prompt_ids=prompt, max_new_tokens=64)
    assert ref["token_ids"] in (ids, ids[:-1]) and ref["finish_reason"] == "stop"  # generate may drop the EOS
    r = comp(client, model, prompt=prompt, max_tokens=k + 4, ignore_eos=True, return_token_ids=True)
    g = r.choices[0]
    assert g.finish_reason == "length" and r.usage.completion_tokens == k + 4
    assert extra(g, "token_ids")[:k] == ids
    assert "<|endoftext|>" not in g.text  # skip_special_tokens defaults to true
    r = comp(client, model, prompt=prompt, max_tokens=k + 4, ignore_eos=True, skip_special_tokens=False)
    assert "<|endoftext|>" in r.choices[0].text


def test_finish_reason_length_and_usage_counts(client, model):
    r = comp(client, model, prompt=[PROMPT, PROMPT2], max_tokens=5, ignore_eos=True, n=2, seed=3, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]  # vLLM: index = sample + prompt * n
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.prompt_tokens == len(encode(PROMPT)) + len(encode(PROMPT2))
    assert r.usage.completion_tokens == 20 and r.usage.total_tokens == r.usage.prompt_tokens + 20


# --- completions: streaming ---------------------------------------------------------------------------------
def test_streaming_equals_non_streaming(client, model):
    # note: token strings, not return_tokens_as_token_ids: vLLM's streamed text_offset continues from the text
    # sent so far, which equals the sum of the token lengths only when the tokens are the text's pieces.
    kw = dict(prompt=PROMPT, max_tokens=20, logprobs=2, return_token_ids=True)
    full = comp(client, model, **kw).choices[0]
    chunks = list(comp(client, model, stream=True, **kw))
    assert chunks and all(ch.object == "text_completion" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].id.startswith("cmpl-")
    body = [ch.choices[0] for ch in chunks if ch.choices]
    assert "".join(c.text for c in body) == full.text
    assert sum((extra(c, "token_ids") or [] for c in body), []) == extra(full, "token_ids")
    toks = sum((c.logprobs.tokens for c in body if c.logprobs), [])
    lps = sum((c.logprobs.token_logprobs for c in body if c.logprobs), [])
    offs = sum((c.logprobs.text_offset for c in body if c.logprobs), [])
    assert toks == full.logprobs.tokens and offs == full.logprobs.text_offset
    assert all(close(a, b) for a, b in zip(lps, full.logprobs.token_logprobs, strict=True))
    finishes = [c.finish_reason for c in body if c.finish_reason is not None]
    assert finishes == [full.finish_reason]  # one finishing chunk, the last choice chunk
    assert body[-1].finish_reason == full.finish_reason
    # vLLM streams prompt_token_ids once, in the choice's first chunk
    firsts = [extra(c, "prompt_token_ids") for c in body]
    assert firsts[0] == encode(PROMPT) and all(x is None for x in firsts[1:])
    assert any(extra(ch, "weight_version") == "0" for ch in chunks)


def test_stream_options_include_usage(client, model):
    chunks = list(comp(client, model, prompt=PROMPT, max_tokens=7, ignore_eos=True, stream=True,
                       stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == len(encode(PROMPT)) and last.usage.completion_tokens == 7
    assert last.usage.total_tokens == last.usage.prompt_tokens + 7
    assert all(ch.usage is None for ch in chunks[:-1])
    plain = list(comp(client, model, prompt=PROMPT, max_tokens=7, ignore_eos=True, stream=True))
    assert all(ch.usage is None for ch in plain) and all(ch.choices for ch in plain)


def test_streaming_n_and_prompts_each_choice_finishes_once(client, model):
    chunks = list(comp(client, model, prompt=[PROMPT, PROMPT2], n=2, seed=9, temperature=1.0, max_tokens=6,
                       ignore_eos=True, stream=True, return_token_ids=True))
    full = comp(client, model, prompt=[PROMPT, PROMPT2], n=2, seed=9, temperature=1.0, max_tokens=6,
                ignore_eos=True, return_token_ids=True)
    by = {}
    for ch in chunks:
        for c in ch.choices:
            by.setdefault(c.index, []).append(c)
    assert sorted(by) == [0, 1, 2, 3]
    for i, cs in by.items():
        assert [c.finish_reason for c in cs if c.finish_reason] == ["length"]
        assert sum((extra(c, "token_ids") or [] for c in cs), []) == extra(full.choices[i], "token_ids")
        assert "".join(c.text for c in cs) == full.choices[i].text


# --- chat completions ---------------------------------------------------------------------------------------
def test_chat_completion_has_every_openai_field(client, model):
    r = chat(client, model, [{"role": "user", "content": USER}], max_tokens=8, ignore_eos=True)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == model
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason == "length" and c.logprobs is None
    assert r.usage.prompt_tokens == len(encode(qwen3_chat([{"role": "user", "content": USER}])))
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert extra(r, "weight_version") == "0"


def test_chat_greedy_equals_mxq_generate_chat(client, model):
    ref = mxq_generate(USER, max_new_tokens=16, chat=True)
    r = chat(client, model, [{"role": "user", "content": USER}], max_tokens=16, return_token_ids=True)
    c = r.choices[0]
    assert extra(c, "token_ids") == ref["token_ids"]
    assert c.message.content == ref["text"]
    assert c.finish_reason == ref["finish_reason"]


MULTI = [
    {"role": "system", "content": "You are a Python expert."},
    {"role": "user", "content": "What does len() do?"},
    {"role": "assistant", "content": "<think>\nThe user asks about len.\n</think>\n\nIt returns the length."},
    {"role": "user", "content": "And sorted()?"},
]


@pytest.mark.parametrize("kwargs", [{}, {"chat_template_kwargs": {"enable_thinking": False}},
                                    {"chat_template_kwargs": {"enable_thinking": True}},
                                    {"add_generation_prompt": False}])
def test_chat_prompt_is_the_qwen3_template(client, model, kwargs):
    r = chat(client, model, MULTI, max_tokens=2, return_token_ids=True, **kwargs)
    think = kwargs.get("chat_template_kwargs", {}).get("enable_thinking")
    want = encode(qwen3_chat(MULTI, add_generation_prompt=kwargs.get("add_generation_prompt", True),
                             enable_thinking=think))
    # vLLM: chat responses carry prompt_token_ids at the top level
    assert extra(r, "prompt_token_ids") == want
    assert r.usage.prompt_tokens == len(want)


def test_chat_text_content_parts_equal_a_string(client, model):
    a = chat(client, model, [{"role": "user", "content": USER}], max_tokens=8, return_token_ids=True)
    b = chat(client, model, [{"role": "user", "content": [{"type": "text", "text": USER}]}], max_tokens=8,
             return_token_ids=True)
    assert extra(b, "prompt_token_ids") == extra(a, "prompt_token_ids")
    assert b.choices[0].message.content == a.choices[0].message.content


def test_chat_logprobs_and_top_logprobs(client, model):
    r = chat(client, model, [{"role": "user", "content": USER}], max_tokens=6, ignore_eos=True, logprobs=True,
             top_logprobs=3, return_token_ids=True)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert [x.token for x in content] == [decode([t], skip_special_tokens=False) for t in extra(c, "token_ids")]
    for x in content:
        assert x.logprob <= 0 and isinstance(x.bytes, list)
        assert bytes(x.bytes).decode("utf-8", "replace") == x.token
        assert len(x.top_logprobs) == 3
        vals = [t.logprob for t in x.top_logprobs]
        assert vals == sorted(vals, reverse=True)
        assert x.top_logprobs[0].token == x.token and close(x.top_logprobs[0].logprob, x.logprob)
    r = chat(client, model, [{"role": "user", "content": USER}], max_tokens=4, ignore_eos=True, logprobs=True,
             return_token_ids=True, return_tokens_as_token_ids=True)
    c = r.choices[0]
    assert [x.token for x in c.logprobs.content] == [f"token_id:{t}" for t in extra(c, "token_ids")]
    assert all(x.top_logprobs == [] for x in c.logprobs.content)  # top_logprobs defaults to 0


def test_chat_streaming_equals_non_streaming(client, model):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": USER}]
    full = chat(client, model, msgs, max_tokens=16, return_token_ids=True)
    chunks = list(chat(client, model, msgs, max_tokens=16, return_token_ids=True, stream=True))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks) and len({ch.id for ch in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-")
    body = [ch.choices[0] for ch in chunks if ch.choices]
    assert body[0].delta.role == "assistant"
    assert all(c.delta.role in (None, "assistant") for c in body)
    assert "".join(c.delta.content or "" for c in body) == full.choices[0].message.content
    assert sum((extra(c, "token_ids") or [] for c in body), []) == extra(full.choices[0], "token_ids")
    assert [c.finish_reason for c in body if c.finish_reason] == [full.choices[0].finish_reason]
    assert extra(chunks[0], "prompt_token_ids") == extra(full, "prompt_token_ids")
    with_usage = list(chat(client, model, msgs, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens == full.usage.completion_tokens
    assert with_usage[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_n_with_seed(client, model):
    msgs = [{"role": "user", "content": USER}]
    r = chat(client, model, msgs, n=2, seed=77, temperature=1.0, max_tokens=8, ignore_eos=True,
             return_token_ids=True)
    assert [c.index for c in r.choices] == [0, 1]
    for i, c in enumerate(r.choices):
        one = chat(client, model, msgs, seed=77 + i, temperature=1.0, max_tokens=8, ignore_eos=True,
                   return_token_ids=True).choices[0]
        assert extra(one, "token_ids") == extra(c, "token_ids") and one.message.content == c.message.content
    assert r.usage.completion_tokens == 16


def test_chat_max_completion_tokens_and_stop(client, model):
    msgs = [{"role": "user", "content": USER}]
    r = chat(client, model, msgs, max_tokens=None, max_completion_tokens=5, ignore_eos=True)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    text = chat(client, model, msgs, max_tokens=24, ignore_eos=True).choices[0].message.content
    p, s = _stop_string(text)
    c = chat(client, model, msgs, max_tokens=24, ignore_eos=True, stop=[s]).choices[0]
    assert c.message.content == text[:p] and c.finish_reason == "stop" and extra(c, "stop_reason") == s


def test_special_tokens_in_a_text_prompt_encode_as_their_ids(client, model):
    text = "x = 1<|endoftext|>y = 2<|im_start|>"
    want = tokenizer().encode(text, add_special_tokens=True).ids
    assert EOS in want
    r = comp(client, model, prompt=text, max_tokens=1, return_token_ids=True)
    assert extra(r.choices[0], "prompt_token_ids") == want
