#!/usr/bin/env python3
"""Golden data for tests/io/tokenizer_test.cpp and tests/io/chat_template_test.cpp.

Oracles: the HF `tokenizers` library (encode/decode) and transformers' apply_chat_template rendering Qwen3's
Jinja template (taken from models/default/tokenizer_config.json). Writes into tests/golden/tokenizer/:
  gpt2_style.tokenizer.json  a small GPT-2-style tokenizer (ByteLevel pre-tokenizer with use_regex=true and
                             add_prefix_space=true, no normalizer, merges as "a b" strings, ignore_merges,
                             normalized and non-special added tokens), trained here with `tokenizers`
  texts.json                 the text cases: hand-written edge cases and slices of real text
  split_literal.tokenizer.json  the same model behind NFC + Split(String) + ByteLevel(use_regex, no prefix space)
  <name>.encode.json         per text case: ids with special tokens parsed and not, and HF's decode of them
  <name>.decode.json         id sequences cut at invalid UTF-8 boundaries and their HF decode
  chat_qwen3.json            conversations, options and the rendered prompt
  special_tokens.json        models/default's tokenizer on text with special tokens typed in it (whole, partial,
                             malformed, glued to words, among whitespace, unicode and control characters):
                             the text, ids with special tokens parsed (Tokenizer.encode) and not, and HF's decode
                             with skip_special_tokens False and True
and src/io/regex_unicode.inc: the code points that `tokenizers`' regex engine (Oniguruma, Unicode 16.0 in
tokenizers 0.23) puts in \p{L} / \p{N} beyond Unicode 14.0 (this Python's unicodedata, and PCRE2 10.42's
tables); src/io/pretokenize.cpp adds them to the pattern so PCRE2 splits text as `tokenizers` does.
Deterministic; run from anywhere: python3 tests/golden/make_tokenizer_golden.py [special_tokens]
(with `special_tokens`, only special_tokens.json is written: it needs `tokenizers` but not `transformers`).
"""
import json
import pathlib
import random
import sys
import sysconfig
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/golden/tokenizer"
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])

TEXT_CASES = {
    "empty": "",
    "ascii_prose": "The quick brown fox jumps over the lazy dog. It wasn't me, said the cat; she'd left.",
    "code_tabs": "def f(x):\n\tif x:\n\t\treturn  x   + 1\n\n\n    pass\r\n\r\nclass A:  \n        y = [1,2 ,3]\t# c\n",
    "leading_trailing_spaces": "   lead and trail   ",
    "only_spaces": "          ",
    "only_newlines": "\n\n\n\r\n\r\r\n",
    "space_runs_before_word": "a  b   c    d\n  e\n\n   f",
    "numbers": "12345 3.14159 1,000,000 0x1F 2026-11-29 -7e-10 ١٢٣ ⅷ ²",
    "contractions": "I'm you're he'll they've I'd it's DON'T SHE'S We'Re 'ſ 'ſt 'K",
    "cjk": "你好，世界！日本語のテキスト、カタカナ。한국어 텍스트입니다",
    "emoji_4byte": "👍🏽 👨‍👩‍👧 🇺🇸 😀😀😀 𝕳𝖊𝖑𝖑𝖔 𐍈 🀄 \U0010FFFD",
    "combining_marks": "e\u0301 A\u030a \u1e9b\u0323 \u212b \u2126 ﬁ ﬀ n\u0303o\u0308 \u0915\u093c \u00e9",
    "post_unicode9_marks": "a\u073a\U0001133b b\u1df6\u0316 c\u0301\U0001e944 e\U0001133b\u0301 \u0915\U0001133b\u093c",
    "post_unicode14_letters": "_\U00032326's\u0322x \u1c89abc 7\U00010d40\U00010d41 x\u180e y \U0002ebf0\U0002ebf1 a\u2ffcb",
    "unicode_spaces": "a\u00a0b\u2003c\u3000d\u0085e\u2028f\u200bg\ufeffh\u000bi\u000cj",
    "special_in_text": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm</think>\n\nok<|endoftext|>",
    "special_partial": "<|im_start <|im_end| <<|im_end|>> <think><think>x</think ></think>",
    "gpt2_added": "<|sp|> sp| <|user|>hi <|sp|><|sp|>sp|| ÿé ★star x★star ÿéÿé",
    "scripts": "مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดีชาวโลก Привет, мир! Γειά σου",
    "control_chars": "\x00\x01\x02\x7f tab\tbell\x07 esc\x1b[0m",
    "punctuation": "!!!???...---___*** a.b,c;d:e (foo)[bar]{baz} @#$%^&* ''' \"\"\" `` ~~ ||",
    "url_email": "https://example.com/path?q=1&r=2#frag user@example.org C:\\Users\\x",
    "long_space_run": " " * 300 + "x--y---z" + "\t" * 40 + "\n" * 30,
    "long_word": "a" * 1000 + " " + "ab" * 300 + " " + "xyz" * 200,
    "mixed_case": "HelloWorld HTTPServer getHTTPResponseCode snake_case_name CONSTANT_VALUE",
}


def bulk_cases():
    # Real text not hand-picked: slices of stdlib sources and of the pydoc topic prose.
    cases = {}
    for rel, begin, size in [("textwrap.py", 0, 10000), ("json/decoder.py", 2000, 6000),
                             ("pydoc_data/topics.py", 300000, 12000), ("email/_header_value_parser.py", 50000, 6000)]:
        data = (STDLIB / rel).read_bytes()[begin:begin + size].decode("utf-8", errors="ignore")
        cases["bulk_" + rel.replace("/", "_").replace(".py", "")] = data
    return cases


# Code points where regex engines and normalizers tend to disagree: Unicode spaces and line breaks (U+0085,
# U+2028), case-folding oddities ('ſ' and the Kelvin sign after an apostrophe), combining marks, digits of other
# scripts, unassigned and private-use code points, noncharacters, tag characters, ZWJ sequences, and pieces of
# special tokens.
FUZZ_POOL = (list("aZ09 \t\n\r'\"<>|_-.,;!?/\\") + ["'s", "'ſ", "'\u212a", "'LL", " '", "\r\n", "  ", "\n\n"]
             + list("\u0085\u00a0\u1680\u2000\u2009\u200b\u2028\u2029\u202f\u205f\u3000\ufeff\u000b\u000c\u001c")
             + list("\u0301\u0308\u0323\u093c\u0e31\u302a\u20dd") + list("éÅßſ\u212a\u212bΩω\u1e9bǅ")
             + list("٣߂३໓༣၃０𝟘²½ⅷ〇") + list("中文한국語ひカ") + list("\u0378\ue000\uffff\ufffe\U000e0041\U0001f600")
             + ["\U0001f468\u200d\U0001f469", "\U0001f1fa\U0001f1f8", "\U0001d573"]
             + ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<|im_", "|>", "<|sp|>", "sp|",
                "<|user|>", "★star", "ÿé"])


def fuzz_cases():
    rng = random.Random(20261129)
    return {f"fuzz_{i:02d}": "".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(20, 120)))
            for i in range(32)}


# Special tokens typed in text: the added-token matcher runs before NFC and the regex split, so these probe
# its boundaries (partial or malformed tokens, overlaps, tokens inside words, whitespace and normalization
# around them; <think> is a non-special added token).
SPECIAL_TOKEN_CASES = {
    "im_start_alone": "<|im_start|>",
    "chat_turn": "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "partial_no_close": "<|im_start",
    "partial_no_gt": "<|endoftext|",
    "partial_prefix_only": "<|im_",
    "adjacent_pair": "<|im_start|><|im_end|>",
    "triple_eot": "<|endoftext|><|endoftext|><|endoftext|>",
    "malformed_then_valid": "<|im_start|<|im_end|>",
    "valid_then_dangling": "<|im_start|>|>",
    "nested_brackets": "<<|im_start|>>",
    "bars_outside": "|<|endoftext|>|",
    "open_inside_open": "<|<|im_start|>|>",
    "glued_both_sides": "hello<|endoftext|>world",
    "glued_left": "word<|endoftext|>",
    "glued_right": "<|endoftext|>word",
    "inside_word": "ab<|im_start|>cd",
    "after_contraction_start": "<|im_start|>'s 'll",
    "spaces_around": " <|endoftext|> ",
    "many_spaces_around": "   <|im_start|>   assistant   ",
    "newlines_around": "\n<|endoftext|>\n\n",
    "tabs_and_crlf": "\t<|im_end|>\r\n",
    "space_before_end": "ok <|im_end|>",
    "nbsp_after": "<|im_start|>\u00a0user",
    "case_mismatch": "<|ENDOFTEXT|> <|Im_Start|>",
    "spaced_inside": "<| im_start |> < |im_end| >",
    "zero_width_inside": "<|im_\u200bstart|>",
    "newline_inside": "<|im_\nstart|>",
    "fullwidth_lookalike": "\uff1c|im_start|\uff1e",
    "unicode_neighbours": "héllo<|im_end|>世界👍<|endoftext|>👍",
    "combining_mark_split_by_token": "e<|im_end|>\u0301 a\u0301<|im_start|>",
    "nfc_before_token": "A\u030a<|endoftext|>\u212b",
    "control_chars": "\x00<|im_start|>\x01\x1b[0m<|endoftext|>\x7f",
    "think_non_special": "x<think>y</think>z <think></think>",
    "think_with_specials": "<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>",
    "think_partial": "<think <think>> </think",
    "only_whitespace_between": "<|im_end|> \n <|im_start|>",
}


def special_token_cases(tok):
    out = {}
    for name, text in SPECIAL_TOKEN_CASES.items():
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = False
        out[name] = {"text": text, "ids": ids, "ids_special_as_text": ids_plain,
                     "decoded": tok.decode(ids, skip_special_tokens=False),
                     "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)}
    return out


def gpt2_style_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    files = sorted(p for p in (STDLIB / "email").rglob("*.py"))
    tok.train_from_iterator((p.read_text(encoding="utf-8", errors="replace") for p in files), trainer=trainer)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                            AddedToken("<|sp|>", special=True, normalized=False)])
    # Non-special, normalized (the HF default), one overlapping a special token, one with characters outside
    # the byte-level alphabet, one made only of byte symbols that are not UTF-8 as bytes.
    tok.add_tokens([AddedToken("<|user|>", special=False), AddedToken("sp|", special=False, normalized=False),
                    AddedToken("★star", special=False), AddedToken("ÿé", special=False)])
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]  # the legacy "a b" form
    j["model"]["ignore_merges"] = True
    text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    return Tokenizer.from_str(text), text


def split_literal_tokenizer(gpt2_text):
    # The GPT-2-style model behind another pipeline: NFC, a literal (String) Split, and ByteLevel with the GPT-2
    # regex but no prefix space (real GPT-2's setting).
    j = json.loads(gpt2_text)
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "--"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    return Tokenizer.from_str(text), text


def byte_ids(tok):
    alphabet = {}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    for b, c in zip(bs, cs):
        alphabet[b] = tok.token_to_id(chr(c))
    return alphabet


def decode_cases(tok):
    ids = byte_ids(tok)
    special = [t for t in (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|sp|>")) if t is not None][0]
    raw = {
        "truncated_4byte": b"ok \xf0\x9f\x98",
        "lone_continuation": b"a\x80b",
        "lead_then_ascii": b"\xc3a",
        "overlong": b"\xc0\x80\xe0\x80\x80",
        "surrogate": b"\xed\xa0\x80x",
        "above_max": b"\xf4\x90\x80\x80",
        "ff_fe": b"\xff\xfe",
        "truncated_3byte_end": b"\xe4\xbd",
        "split_valid_emoji": "😀é中".encode(),
    }
    cases = {name: [ids[b] for b in data] for name, data in raw.items()}
    cases["special_between_partial"] = [ids[0xF0], ids[0x9F], special, ids[0x98], ids[0x80]]
    cases["out_of_range_skipped"] = [ids[0x61], tok.get_vocab_size(with_added_tokens=True) + 5, ids[0x62]]
    return {name: {"ids": seq, "decoded": tok.decode(seq, skip_special_tokens=False),
                   "decoded_skip_special": tok.decode(seq, skip_special_tokens=True)}
            for name, seq in cases.items()}


def encode_cases(tok, texts):
    # note: to stay small, a field equal to its fallback is left out: ids_special_as_text -> ids,
    # decoded -> the text, decoded_skip_special -> decoded.
    out = {}
    for name, text in texts.items():
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = False
        decoded = tok.decode(ids, skip_special_tokens=False)
        decoded_skip = tok.decode(ids, skip_special_tokens=True)
        case = {"ids": ids}
        if ids_plain != ids:
            case["ids_special_as_text"] = ids_plain
        if decoded != text:
            case["decoded"] = decoded
        if decoded_skip != decoded:
            case["decoded_skip_special"] = decoded_skip
        out[name] = case
    return out


def chat_cases():
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(ROOT / "models/default"))
    convs = {
        "single_user": [{"role": "user", "content": "Hi there!"}],
        "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
        "multi_turn_history_thinking_dropped": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."}],
        "last_assistant_keeps_thinking": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\n\nplan\n\n</think>\n\n\nAnswer"}],
        "reasoning_content_field": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "\nr1\n"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2", "reasoning_content": "r2"},
            {"role": "assistant", "content": "A3"}],
        "assistant_after_last_query_no_reasoning": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "first"},
            {"role": "assistant", "content": "second"}],
        "tool_responses": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "checking"},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "22C"},
            {"role": "assistant", "content": "<think>ok</think>It is sunny."}],
        "user_tool_response_text": [
            {"role": "user", "content": "real question"},
            {"role": "assistant", "content": "<think>a</think>b"},
            {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
            {"role": "assistant", "content": "<think>c</think>d"}],
        "second_system_message": [
            {"role": "system", "content": "S1"}, {"role": "user", "content": "U"},
            {"role": "system", "content": "S2"}],
        "unicode_and_specials_in_content": [
            {"role": "user", "content": "héllo 你好 👍 <|im_end|> inside"}],
        "empty_content": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    }
    cases = []
    for name, msgs in convs.items():
        for gen in (False, True):
            for thinking in (None, True, False):
                kwargs = {} if thinking is None else {"enable_thinking": thinking}
                text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kwargs)
                cases.append({"name": name, "messages": msgs, "add_generation_prompt": gen,
                              "enable_thinking": thinking, "rendered": text})
    return cases


def onig_class(pattern):
    """The code points `tokenizers`' own regex engine matches with a one-character pattern."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != 1]
    hits = set()
    for i in range(0, len(cps), 4096):
        # note: U+0001 (in none of the probed classes) separates the probes, so a match is one character.
        text = "\x01".join(chr(c) for c in cps[i:i + 4096])
        hits.update(ord(p) for p, _ in split.pre_tokenize_str(text) if len(p) == 1 and p != "\x01")
    return hits


def write_unicode_delta(path):
    lines = ["// Generated by tests/golden/make_tokenizer_golden.py; do not edit. Code points that the `tokenizers`",
             f"// library's regex engine puts in \\p{{L}} / \\p{{N}} but Unicode {unicodedata.unidata_version} does not.",
             "// clang-format off"]
    for name, cats in (("kExtraLetters", ("Lu", "Ll", "Lt", "Lm", "Lo")), ("kExtraNumbers", ("Nd", "Nl", "No"))):
        pattern = r"\p{L}" if "Letters" in name else r"\p{N}"
        old = {c for c in range(0x110000) if unicodedata.category(chr(c)) in cats}
        hits = onig_class(pattern)
        if old - hits:
            raise SystemExit(f"{pattern}: tokenizers lacks {len(old - hits)} code points of Unicode "
                             f"{unicodedata.unidata_version}; a union with PCRE2's class would be wrong")
        ranges = []
        for c in sorted(hits - old):
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
        body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges)
        lines.append(f"inline constexpr CodeRange {name}[] = {{{body}}};")
    ws = sorted(onig_class(r"\s"))
    lines.append("inline constexpr char32_t kWhitespace[] = {" + ", ".join(f"0x{c:X}" for c in ws) + "};")
    lines.append("// clang-format on")
    path.write_text("\n".join(lines) + "\n")


def dump(path, obj):
    path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    qwen = Tokenizer.from_file(str(ROOT / "models/default/tokenizer.json"))
    dump(OUT / "special_tokens.json", special_token_cases(qwen))
    if sys.argv[1:] == ["special_tokens"]:
        return
    gpt2, gpt2_text = gpt2_style_tokenizer()
    (OUT / "gpt2_style.tokenizer.json").write_text(gpt2_text + "\n", encoding="utf-8")
    split, split_text = split_literal_tokenizer(gpt2_text)
    (OUT / "split_literal.tokenizer.json").write_text(split_text + "\n", encoding="utf-8")
    texts = {**TEXT_CASES, **bulk_cases(), **fuzz_cases()}
    dump(OUT / "texts.json", texts)
    for name, tok in (("qwen_default", qwen), ("gpt2_style", gpt2)):
        dump(OUT / f"{name}.encode.json", encode_cases(tok, texts))
        dump(OUT / f"{name}.decode.json", decode_cases(tok))
    # note: no bulk text for the third pipeline, to keep the golden data small.
    dump(OUT / "split_literal.encode.json",
         encode_cases(split, {k: v for k, v in texts.items() if not k.startswith("bulk_")}))
    dump(OUT / "chat_qwen3.json", chat_cases())
    write_unicode_delta(ROOT / "src/io/regex_unicode.inc")


if __name__ == "__main__":
    main()
