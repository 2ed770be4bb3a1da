#!/usr/bin/env python3
"""Compare our C tokenizer with Hugging Face `tokenizers` (run it through
scripts/tokenizer-check, which finds the interpreter).

Builds tokenizer.json forms with the `tokenizers` library itself (BPE models
trained on the corpus below, each form with its own normalizer,
pre-tokenizer, decoder, post-processor and added tokens), encodes and
decodes every corpus string with both, and prints the mismatches per form.
Exit status 1 if any.

    scripts/tokenizer-check [--write] [--build DIR] [--show N]

--write also stores, under tests/data/tokenizer/, the corpus (corpus.json),
each form (<form>.json) and the answers of `tokenizers` (<form>.golden.json:
ids without and with special tokens, decodes with and without
skip_special_tokens; null where an answer repeats the one beside it), which
tests/test_tokenizer_forms.c replays in CI.  Training is not bit-reproducible
(tie order in the BPE trainer), so --write rewrites forms and answers
together.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                        normalizers, pre_tokenizers, processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")

GPT2_RE = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
           r"|\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
             r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")


# ---- corpus -----------------------------------------------------------------

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the sunshine with her friends.",
    "It's a truth universally acknowledged, isn't it? We'll see.",
    "He said: \"I'VE never seen anything like it!\" and LEFT.",
    "Tokenizers split text into pieces; models read the pieces.",
    "In 1969, humans first walked on the Moon (July 20th).",
    "Don't panic -- it's only a test... or is it?",
    "Mr. Smith's dog barked at 3:45 p.m., waking everyone up.",
    "A journey of a thousand miles begins with a single step.",
    "Résumé, naïve café, façade, coöperate, jalapeño, Zoë.",
    "Straße, Ærøskøbing, Øresund, Łódź, Dvořák, İstanbul.",
    "ΣΊΣΥΦΟΣ and the Greek word ὀδυσσεύς; final sigma: ΟΔΟΣ.",
    "Москва — столица России. Привет, мир!",
    "the the the the the the the the",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
    "#include <stdio.h>\nint main(void) { puts(\"hi\"); }",
    "if (a && b || !c) { x->y = z[0]; }",
    "const url = `https://example.com/path?q=1&r=2#frag`;",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "x_1 = foo_bar(baz=42, qux='str')  # comment",
    "<div class=\"a\">&lt;tag&gt; &amp; text</div>",
    "    indented\n        more\n\t\ttabs\r\n",
    "λx. x + 1; ∀ε>0 ∃δ>0: |x−y|<δ ⇒ |f(x)−f(y)|<ε",
    "{\"key\": [1, 2.5, -3e10, true, null]}",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "a==b!=c<=d>=e::f...g??h||i",
    "__init__ self.__dict__ __name__ == '__main__'",
]
WHITESPACE = [
    " ", "  ", "\t", "\n", "\r\n", "   leading", "trailing   ",
    "a  b   c    d", "a\tb\t\tc", "a\nb\n\nc\n\n\n", " \n \n ", "\u00a0nbsp\u00a0",
    "em\u2003space", "ideo\u3000space", "line\u2028sep", "mixed \t\n\r\f\v end",
    "\n\nstart", "end\n\n", "x" + " " * 20 + "y", "\t" * 8,
]
CJK = [
    "你好，世界！", "我爱自然语言处理。", "日本語のテキストです。", "東京は日本の首都です",
    "한국어 문장입니다.", "안녕하세요 세계", "漢字とひらがなとカタカナ", "中文 English 混合",
    "龘靐齉", "𠀀𠀁𠀂 (CJK Extension B)", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    "半角ｶﾀｶﾅ", "「引用」『二重』【括弧】",
]
ARABIC = [
    "مرحبا بالعالم", "اللغة العربية جميلة.", "السلام عليكم ورحمة الله",
    "كتب الطالب ٣ دروس في ٢٠٢٤", "مَرْحَبًا (with harakat)", "عربي English mixed",
    "ﻻ ﷺ ﷽", "فارسی: سلام دنیا", "עברית: שלום עולם",
]
HINDI = [
    "नमस्ते दुनिया", "हिन्दी भाषा सुंदर है।", "मैं घर जा रहा हूँ",
    "क्षत्रिय ज्ञान श्री", "संख्या १२३४५", "हिंदी and English",
    "বাংলা ভাষা", "தமிழ் மொழி", "ไทย ภาษา", "ພາສາລາວ",
]
EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑🏿‍🚀", "❤️‍🔥", "🇫🇷🇯🇵", "#️⃣ 1️⃣",
    "I ❤️ NY 🗽", "family: 👩‍👩‍👦 ok", "😀😃😄😁", "☺︎ vs ☺️", "🫠🫥🫶",
]
ACCENTS = ["café", "naïve", "Ångström", "résumé", "Éléphant", "ñandú",
           "crème brûlée", "Øre", "Ǆemal", "ḱṓẃ", "ﬁne ﬂour", "Ⅻ ① ㎞",
           "ǅ ǈ ǋ", "x²+y³", "½ ¼", "™ ©", "K vs \u212a (Kelvin)",
           "ſ long s", "Å vs \u212b"]
CONTROL = ["\x00", "a\x00b", "\x01\x02\x03", "bell\x07", "esc\x1b[0m",
           "del\x7f", "nel\u0085x", "zw\u200bsp", "bom\ufeffx", "rtl\u200fmark",
           "\x1c\x1d\x1e\x1f", "soft\u00adhyphen", "tab\x0bvt\x0cff",
           "zwj\u200dzwnj\u200c", "replacement \ufffd char", "private \ue000"]
SPECIAL = [
    "<s>", "</s>", "<s>hello</s>", "<s> hello </s>", "a<s>b", "<|endoftext|>",
    "text<|endoftext|>more", "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|> system <|im_end|>", "[INST] do it [/INST]", " [INST]x[/INST] ",
    "<unk>", "<<s>>", "</s></s>", "<s", "s>", "<|endoftext", "[INST]",
    "<extra_0>", "x<extra_0>y", "word <extra_0> word", "<extra_0><extra_0>",
    "Hello World", "hello world", "HELLO WORLD", "sayHello World", "Hello Worlds",
    " Hello World ", "xHello World", "<tag>", "a <tag> b", "a<tag>b",
    "<tag> <tag>", "  <tag>  ", "\n<tag>\n", "<sep>", "a <sep> b", "<sep><sep>",
    "<|begin_of_text|>", "<|begin_of_text|>hi",
]
DIGITS = [
    "0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159",
    "1,000,000", "2024-01-15", "+1 (555) 123-4567", "v1.2.3", "0x1F",
    "١٢٣ ٤٥٦", "१२३", "１２３", "²³", "Ⅷ", "௧௨", "9999999999999999",
    "a1b2c3", "1st 2nd 3rd 4th", "100%", "$5.99", "€10,50", "10^6",
]


def corpus():
    out = []
    out += PROSE
    out += [p.lower() for p in PROSE] + [p.upper() for p in PROSE]
    out += [" " + p for p in PROSE] + [p + "  " for p in PROSE[:8]]
    out += CODE
    out += WHITESPACE
    out += [w + "x" + w for w in WHITESPACE[:10]]
    out += CJK + ARABIC + HINDI + EMOJI
    out += [" " + s for s in CJK[:6] + ARABIC[:4] + HINDI[:4] + EMOJI[:6]]
    for a in ACCENTS:
        out += [unicodedata.normalize("NFC", a), unicodedata.normalize("NFD", a)]
    out += CONTROL
    out += SPECIAL
    out += [s + " " + t for s, t in zip(SPECIAL[::2], SPECIAL[1::2])]
    out += DIGITS
    out += [" " + d for d in DIGITS[:12]] + [d + "x" for d in DIGITS[:12]]
    out += ["", "'s 'S 'll 'LL 'Re", "it's don't I'M you'RE", "İı Iı ß ẞ",
            "Ⓐⓑⓒ circled", "x_y_z", "a-b-c--d", "end.", "...", "?!",
            "ǅungla", "ﬀ ﬃ", "Ⅳ. Kapitel", "ΑΒΓ αβγ", "ÀÉÎÕÜ", "\r", "\r\r\n",
            "...!!!???", "--", "a - b", "1.5-2.5", "-5", "e.g. i.e.",
            "# Title", "**bold** text", "  # indented", "#", "\u0301accent first",
            "mixed 中文 عربي हिन्दी 😀 123"]
    # pairs of kinds side by side, with and without a space between
    kinds = [PROSE, CODE, CJK, ARABIC, HINDI, EMOJI, DIGITS, CONTROL, SPECIAL]
    for i in range(40):
        x = kinds[i % len(kinds)][i % len(kinds[i % len(kinds)])]
        y = kinds[(i * 5 + 3) % len(kinds)]
        y = y[(i * 7) % len(y)]
        out.append(x + ("" if i % 2 else " ") + y)
    # long texts: several kinds joined
    for i in range(12):
        out.append(" ".join(PROSE[i:i + 3]) + "\n" + CODE[i % len(CODE)] +
                   CJK[i % len(CJK)] + " " + EMOJI[i % len(EMOJI)] + " " +
                   DIGITS[i % len(DIGITS)])
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


# ---- tokenizer forms ----------------------------------------------------------

def training_text(texts):
    return texts * 3 + PROSE * 20 + CODE * 10


def train(tok, texts, vocab, special, byte_level=False, limit=None):
    kw = dict(vocab_size=vocab, special_tokens=special, show_progress=False)
    if byte_level:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if limit:
        kw["limit_alphabet"] = limit
    tok.train_from_iterator(training_text(texts), trainers.BpeTrainer(**kw))
    return tok


def with_byte_fallback(tok, unk="<unk>"):
    """The trained BPE again, with <0xNN> tokens and byte_fallback."""
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    for b in range(256):
        name = "<0x%02X>" % b
        if name not in vocab:
            vocab[name] = len(vocab)
    d["model"]["byte_fallback"] = True
    d["model"]["unk_token"] = unk
    return Tokenizer.from_str(json.dumps(d))


def f_smollm(texts):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    return train(t, texts, 900, ["<|endoftext|>", "<|im_start|>",
                                 "<|im_end|>"], byte_level=True)


def f_gpt2(texts):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    train(t, texts, 800, ["<|endoftext|>"], byte_level=True)
    t.add_tokens([AddedToken("<tag>", lstrip=True, rstrip=True,
                             normalized=False)])
    return t


def f_llama3(texts):
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    train(t, texts, 900, ["<|begin_of_text|>", "<|end_of_text|>"],
          byte_level=True)
    t.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[
            ("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])
    return t


def f_qwen2(texts):
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    train(t, texts, 900, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
          byte_level=True)
    t.add_tokens([AddedToken("<sep>", single_word=True, normalized=True)])
    return t


def spm_decoder(prepend="first"):
    return decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(),
        decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])


def f_mistral(texts):
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    # removing leading characters moves the text off original offset 0,
    # which Metaspace's prepend_scheme "first" looks at
    t.normalizer = normalizers.Sequence([
        normalizers.Strip(left=True, right=False),
        normalizers.Replace(Regex("^[#*]+"), "")])
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                               prepend_scheme="first",
                                               split=False)
    train(t, texts, 700, ["<unk>", "<s>", "</s>"], limit=120)
    t = with_byte_fallback(t)
    t.decoder = decoders.Metaspace(replacement="\u2581",
                                   prepend_scheme="first", split=False)
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)])
    t.add_special_tokens([AddedToken("[INST]", lstrip=True, normalized=False),
                          AddedToken("[/INST]", rstrip=True,
                                     normalized=False)])
    return t


def f_spm_legacy(texts):
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([
        normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    train(t, texts, 700, ["<unk>", "<s>", "</s>"], limit=120)
    t = with_byte_fallback(t)
    t.decoder = spm_decoder()
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    t.add_tokens([AddedToken("<extra_0>", normalized=True),
                  AddedToken("<tag>", single_word=True, normalized=False)])
    return t


def f_normalized(texts):
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([
        normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Strip(left=True, right=True),
        normalizers.Replace(Regex(r"\s+"), " ")])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                 split=True)])
    t.decoder = decoders.Metaspace(replacement="\u2581",
                                   prepend_scheme="always", split=True)
    train(t, texts, 600, ["<unk>", "<s>", "</s>"], limit=100)
    t.add_tokens([AddedToken("Hello World", single_word=True,
                             normalized=True)])
    return t


def f_splits(texts):
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.NFD(),
                                         normalizers.Strip(left=False,
                                                           right=True)])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\d+"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"\w+"), behavior="isolated", invert=True),
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"^.{1,3}"), behavior="isolated")])
    t.decoder = decoders.Sequence([decoders.Replace(Regex(r"[aeiou]+"), "_"),
                                   decoders.Strip(content="-", left=0,
                                                  right=1)])
    return train(t, texts, 600, ["<unk>", "<s>", "</s>"], limit=150)


def f_whitespace(texts):
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([
        normalizers.NFKC(), normalizers.Replace("``", "\""),
        normalizers.Lowercase()])
    t.decoder = decoders.Replace("e", "E")
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(
            behavior="merged_with_next")])
    return train(t, texts, 600, ["<unk>", "[INST]"], limit=150)


def f_bert(texts):
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.NFD(),
                                         normalizers.Lowercase()])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.BertPreTokenizer(),
        pre_tokenizers.CharDelimiterSplit("x"),
        pre_tokenizers.Metaspace(replacement="_", prepend_scheme="never")])
    t.decoder = decoders.Metaspace(replacement="_", prepend_scheme="never")
    return train(t, texts, 600, ["<unk>", "<s>"], limit=150)


FORMS = [("smollm", f_smollm), ("gpt2", f_gpt2), ("llama3", f_llama3),
         ("qwen2", f_qwen2), ("mistral", f_mistral),
         ("spm_legacy", f_spm_legacy), ("normalized", f_normalized),
         ("splits", f_splits), ("whitespace", f_whitespace), ("bert", f_bert)]


# ---- comparison -----------------------------------------------------------------

def hf_answers(tok, texts):
    ids = [tok.encode(s, add_special_tokens=False).ids for s in texts]
    ids_sp = [tok.encode(s, add_special_tokens=True).ids for s in texts]
    return {"ids": ids, "ids_special": ids_sp,
            "decode": [tok.decode(i, skip_special_tokens=False) for i in ids_sp],
            "decode_skip": [tok.decode(i, skip_special_tokens=True)
                            for i in ids_sp]}


def compact(want):
    """The golden file: null where an answer repeats another (ids: equal to
    ids_special; decode_skip: equal to decode) -- half the bytes."""
    return {"ids": [None if a == b else a
                    for a, b in zip(want["ids"], want["ids_special"])],
            "ids_special": want["ids_special"],
            "decode": want["decode"],
            "decode_skip": [None if a == b else a for a, b in
                            zip(want["decode_skip"], want["decode"])]}


def ours(tok_dump, tok_path, corpus_path):
    p = subprocess.run([tok_dump, tok_path, corpus_path], capture_output=True,
                       text=True)
    if p.returncode != 0 and not p.stdout.startswith("{"):
        return None, p.stdout + p.stderr
    rows = [json.loads(l) for l in p.stdout.splitlines()]
    for r in rows:
        for k in ("decode", "decode_skip"):
            if r[k] is not None:
                r[k] = bytes.fromhex(r[k]).decode("utf-8", "replace")
    return rows, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--show", type=int, default=3)
    a = ap.parse_args()
    tok_dump = os.path.join(a.build, "tests", "tok_dump")
    if not os.path.exists(tok_dump):
        sys.exit("tokenizer-check: build tok_dump first "
                 "(cmake --build %s --target tok_dump)" % a.build)
    texts = corpus()
    print("corpus: %d strings" % len(texts))
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        cpath = os.path.join(tmp, "corpus.json")
        with open(cpath, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False)
        if a.write:
            os.makedirs(DATA, exist_ok=True)
            with open(os.path.join(DATA, "corpus.json"), "w",
                      encoding="utf-8") as f:
                json.dump(texts, f, ensure_ascii=False, indent=0)
                f.write("\n")
        for name, build in FORMS:
            tok = build(texts)
            tpath = os.path.join(tmp, name + ".json")
            tok.save(tpath, pretty=False)
            want = hf_answers(tok, texts)
            got, err = ours(tok_dump, tpath, cpath)
            if got is None:
                print("%-11s refused: %s" % (name, err.strip()))
                bad += 1
                continue
            enc = dec = 0
            shown = 0
            for i, s in enumerate(texts):
                e_bad = (got[i]["ids"] != want["ids"][i] or
                         got[i]["ids_special"] != want["ids_special"][i])
                d_bad = (got[i]["decode"] != want["decode"][i] or
                         got[i]["decode_skip"] != want["decode_skip"][i])
                enc += e_bad
                dec += d_bad
                if (e_bad or d_bad) and shown < a.show:
                    shown += 1
                    print("  %s #%d %r" % (name, i, s))
                    for k in ("ids_special", "decode", "decode_skip"):
                        if got[i][k] != want[k][i]:
                            print("    %s: ours %r\n    %s  hf   %r" %
                                  (k, got[i][k], " " * len(k), want[k][i]))
            print("%-11s encode mismatches %d/%d, decode mismatches %d/%d" %
                  (name, enc, len(texts), dec, len(texts)))
            bad += enc + dec
            if a.write:
                tok.save(os.path.join(DATA, name + ".json"), pretty=False)
                with open(os.path.join(DATA, name + ".golden.json"), "w",
                          encoding="utf-8") as f:
                    json.dump(compact(want), f, ensure_ascii=False,
                              separators=(",", ":"))
                    f.write("\n")
    print("total mismatches: %d" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
