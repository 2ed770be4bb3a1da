"""export_check.py - `mcompile export` against the engines (run by
scripts/export-check; not part of CI).

For each case (a model and a compile), the artifact runs in our runtime
(mcrt_logits) and its two exports run where users would run them:
  GGUF               -> llama.cpp (llama_logits, built from the
                        llama-cpp-python sdist)
  compressed-tensors -> transformers + compressed-tensors (float32)
On the same prompt ids each prints the logits at every position and 64
greedy ids.  Reported per export: mean and max KL(ours || engine) over
the positions, top-1 agreement, and how many of the 64 greedy ids are
identical (the count up to the first difference).  gguf-py's reader also
checks the file's metadata types and tensor shapes.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
WORK = os.path.join(BUILD, "export-check", "work")
MCOMPILE = os.path.join(BUILD, "mcompile")
MCRT = os.path.join(BUILD, "export-check", "mcrt_logits")
LLAMA = os.path.join(BUILD, "export-check", "llama_logits")
SHARED = os.path.join(ROOT, "..", "shared")
NGEN = 64


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode,
                                                   r.stderr.strip()[-2000:]))
    return r.stdout


def logits_of(tool, model, ids, vocab):
    out = os.path.join(WORK, "logits-%d.f32" % os.getpid())
    # our runtime's float dot products: its default integer path quantizes
    # the activations to int8 per 32-block (docs/quantization.md), which
    # is the engine's choice, not the weights'; "the same weights" means
    # the exact float path (llama.cpp's own activation quantization shows
    # in the "gguf" column against the dequantized "gguf as f32" one)
    env = dict(os.environ, MC_FLOAT_DOT="1")
    greedy = run([tool, model, " ".join(map(str, ids)), str(NGEN), out],
                 env=env)
    lg = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)[:, :vocab]
    os.remove(out)
    return lg.astype(np.float64), [int(x) for x in greedy.split()]


def transformers_logits(d, ids):
    import torch
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    kw = {}
    if "quantization_config" in json.load(open(os.path.join(d, "config.json"))):
        # dequantize at load: transformers 5.24 + compressed-tensors 0.20
        # build the compressed layout on the meta device without packing
        # the asymmetric zero points, so a packed weight_zero_point (what
        # compress() writes and vLLM reads) does not fit their shapes;
        # the dequantize path runs compressed-tensors' own decompress().
        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    m.eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        lg = m(x).logits[0].double().numpy()
        out = []
        seq = list(ids)
        for _ in range(NGEN):  # greedy by hand: no EOS, no generation config
            nxt = int(m(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(nxt)
            seq.append(nxt)
    return lg, out


def compare(ref, ref_ids, lg, ids):
    def logsm(a):
        a = a - a.max(axis=1, keepdims=True)
        return a - np.log(np.exp(a).sum(axis=1, keepdims=True))
    lp, lq = logsm(ref), logsm(lg)
    kld = (np.exp(lp) * (lp - lq)).sum(axis=1)
    same = 0
    while same < min(len(ids), len(ref_ids)) and ids[same] == ref_ids[same]:
        same += 1
    return {"kld_mean": float(kld.mean()), "kld_max": float(kld.max()),
            "top1": float((ref.argmax(1) == lg.argmax(1)).mean()),
            "greedy_same": same, "greedy_of": len(ref_ids)}


def check_gguf_file(path):
    import gguf
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    for k in ("context_length", "embedding_length", "block_count",
              "attention.head_count", "attention.head_count_kv"):
        f = r.fields["%s.%s" % (arch, k)]
        assert f.types == [gguf.GGUFValueType.UINT32], k
    types = sorted({t.tensor_type.name for t in r.tensors})
    return arch, types


def dequant_gguf(src, dst):
    """The same GGUF with every tensor dequantized to F32 by gguf-py's own
    block decoders (gguf.quants), metadata copied: llama.cpp then runs the
    weights without its CPU matmuls' activation quantization (Q8_0/Q4_x
    dot products quantize the activations to 8 bits per 32-block, F16 ones
    round them to f16), which isolates what the export wrote from how the
    engine computes."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture",
                                          "general.file_type"):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, np.ascontiguousarray(
            x.reshape([int(n) for n in reversed(t.shape)])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def one_case(name, model, compile_args, ids, vocab, gguf_args=()):
    os.makedirs(WORK, exist_ok=True)
    mca = os.path.join(WORK, name + ".mca")
    run([MCOMPILE, model, "--target", "4G", "-q", "-o", mca] + compile_args)
    ref, ref_ids = logits_of(MCRT, mca, ids, vocab)
    res = {"case": name, "compile": " ".join(compile_args)}
    g = os.path.join(WORK, name + ".gguf")
    run([MCOMPILE, "export", mca, "--format", "gguf", "-o", g] + list(gguf_args))
    arch, types = check_gguf_file(g)
    lg, gi = logits_of(LLAMA, g, ids, vocab)
    res["gguf"] = dict(compare(ref, ref_ids, lg, gi), arch=arch, types=types)
    gd = os.path.join(WORK, name + "-f32.gguf")
    dequant_gguf(g, gd)
    lgd, gdi = logits_of(LLAMA, gd, ids, vocab)
    res["gguf_dequant"] = compare(ref, ref_ids, lgd, gdi)
    # the quantized file against its own dequantized weights, both in
    # llama.cpp: what the engine's quantized matmuls cost by themselves
    res["gguf_engine_only"] = compare(lgd, gdi, lg, gi)
    if "--gguf-int4" in gguf_args:
        # only the GGUF differs from the case without --gguf-int4: its
        # compressed-tensors export is that case's (transformers is the
        # slow part of a case)
        res["compressed_tensors"] = None
        return res
    d = os.path.join(WORK, name + "-ct")
    run([MCOMPILE, "export", mca, "--format", "compressed-tensors", "-o", d])
    lg, ti = transformers_logits(d, ids)
    res["compressed_tensors"] = compare(ref, ref_ids, lg, ti)
    return res


# the previous check's four texts, then the harder ones: runs of leading,
# trailing and inner spaces, newlines and tabs, digits, unicode (accents,
# CJK, emoji: byte fallback in an SPM vocabulary), a literal "▁",
# special tokens written in the text, and the empty string
TOKENIZER_TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "Hello world!  Two  spaces, a tab\tand\na newline.",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600 (byte fallback)",
    "   leading spaces and 1234567890 digits",
    " x", "  x", "   x", "    x", "x ", "x  ", "trailing   ",
    "a  b   c    d     e", "\n", "\n\n x", " \n ", "line\n\n\nline",
    "1 22 333 4444 55555 3.14159 -42 1,000,000", "0x1F 007 2024-12-01",
    "Hello, World! It's a test -- isn't it? We'll see; I'd say: \"yes\".",
    "\u00e9\u00e8\u00ea \u00fc\u00df \u4e2d\u6587 \u0416\u0438\u0437\u043d\u044c "
    "\U0001f680\U0001f600",
    "tab\there\t\tand  more", "    def f(x):\n        return x * 2\n",
    "THE QUICK BROWN FOX", "\u2581 literal", "a\u200bb", "<s> special </s> "
    "in text", "<|im_start|>user\nhi<|im_end|>", "", " ", "   ",
    "e\u0301 (decomposed) \u00e9 (composed)", "\u00a0non-breaking\u00a0space",
]


def tiny_model_dir(d, tokenizer_json, vocab, arch):
    """A one-layer model (random weights) whose vocabulary is the
    tokenizer's: the GGUF export needs a model around its tokenizer."""
    from safetensors.numpy import save_file
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    tok = json.load(open(tokenizer_json))
    ids = [v for v in tok["model"]["vocab"].values()] + \
        [a["id"] for a in tok.get("added_tokens", [])]
    vocab = max(vocab, max(ids) + 1)
    def tid(name):
        for a in tok.get("added_tokens", []):
            if a["content"] == name:
                return a["id"]
        return tok["model"]["vocab"].get(name)
    bos = tid("<s>") if tid("<s>") is not None else tid("<|begin_of_text|>")
    eos = tid("</s>") if tid("</s>") is not None else tid("<|endoftext|>")
    cfg = {"model_type": arch, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 4, "vocab_size": vocab,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
           "hidden_act": "silu", "tie_word_embeddings": True,
           "torch_dtype": "float32"}
    if bos is not None:
        cfg["bos_token_id"] = bos
    if eos is not None:
        cfg["eos_token_id"] = eos
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    rng = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": rng.normal(0, .2, (vocab, 64)),
         "model.norm.weight": np.ones(64)}
    p = "model.layers.0."
    for n, sh in (("self_attn.q_proj", (64, 64)), ("self_attn.k_proj", (64, 64)),
                  ("self_attn.v_proj", (64, 64)), ("self_attn.o_proj", (64, 64)),
                  ("mlp.gate_proj", (128, 64)), ("mlp.up_proj", (128, 64)),
                  ("mlp.down_proj", (64, 128))):
        t[p + n + ".weight"] = rng.normal(0, .1, sh)
        if arch == "qwen2" and n[-6:] in ("q_proj", "k_proj", "v_proj"):
            t[p + n + ".bias"] = np.zeros(sh[0])
    t[p + "input_layernorm.weight"] = np.ones(64)
    t[p + "post_attention_layernorm.weight"] = np.ones(64)
    save_file({k: v.astype(np.float32) for k, v in t.items()},
              os.path.join(d, "model.safetensors"))
    shutil.copy(tokenizer_json, os.path.join(d, "tokenizer.json"))
    return d


def legacy_form(src, dst):
    """A Metaspace tokenizer.json in the older form of the same tokenizer:
    normalizer Prepend("\u2581") + Replace(" ", "\u2581"), no
    pre-tokenizer (the form Mistral's and Llama 2's repositories ship)."""
    t = json.load(open(src))
    t["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "},
         "content": "\u2581"}]}
    t["pre_tokenizer"] = None
    json.dump(t, open(dst, "w"), ensure_ascii=False)
    return dst


def tokenizer_forms():
    """(name, tokenizer.json, model_type): the real Mistral tokenizer in
    both of its forms, and the forms test_tokenizer_forms replays
    (tests/data/tokenizer, built with the tokenizers library): a
    SentencePiece-style BPE trained by tokenizers (spm_legacy), Qwen2's and
    Llama 3's byte-level BPE, GPT-2's and SmolLM's."""
    forms = []
    mistral = os.path.join(SHARED, "tokenizers", "mistral-7b-instruct-v0.1",
                           "tokenizer.json")
    if os.path.exists(mistral):
        forms.append(("mistral", mistral, "llama"))
        os.makedirs(WORK, exist_ok=True)
        forms.append(("mistral-legacy", legacy_form(
            mistral, os.path.join(WORK, "mistral-legacy.json")), "llama"))
    data = os.path.join(ROOT, "tests", "data", "tokenizer")
    for name, arch in (("spm_legacy", "llama"), ("mistral", "llama"),
                       ("qwen2", "qwen2"), ("llama3", "llama"),
                       ("gpt2", "llama"), ("smollm", "llama")):
        forms.append(("forms-" + name, os.path.join(data, name + ".json"),
                      arch))
    return forms


def tokenizer_case(name, tj, arch):
    """llama.cpp's tokenizer from our GGUF metadata against Hugging Face
    tokenizers on the same tokenizer.json: TOKENIZER_TEXTS and the 414
    strings of tests/data/tokenizer/corpus.json, with BOS as the template
    adds it and special tokens in the text recognised on both sides."""
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(tj)
    d = tiny_model_dir(os.path.join(WORK, "tok-" + name), tj,
                       hf.get_vocab_size(with_added_tokens=True), arch)
    g = os.path.join(WORK, "tok-" + name + ".gguf")
    rep = json.loads(run([MCOMPILE, "export", d, "--format", "gguf", "-o", g,
                          "--json"]))
    texts = TOKENIZER_TEXTS + json.load(open(os.path.join(
        ROOT, "tests", "data", "tokenizer", "corpus.json")))
    tf = os.path.join(WORK, "tok-" + name + ".texts")
    with open(tf, "wb") as f:
        for t in texts:  # a byte count, a newline, the bytes
            b = t.encode("utf-8")
            f.write(b"%d\n" % len(b) + b)
    lines = run([LLAMA, "--tokenize", g, tf]).split("\n")
    added = [a["content"] for a in json.load(open(tj)).get("added_tokens", [])]
    same, shown, lead = 0, 0, 0
    for t, line in zip(texts, lines):
        ours = [int(x) for x in line.split()]
        ref = hf.encode(t).ids
        same += ours == ref
        # what a Metaspace form cannot give llama.cpp: its "\u2581" prefix
        # on text that starts with a space, or after a special token
        lead += ours != ref and (t[:1] in (" ", "\u2581") or
                                 any(a in t for a in added))
        if ours != ref and shown < 3:
            shown += 1
            print("%s: differs on %r:\n  llama.cpp %s\n  HF        %s" % (
                name, t, [hf.id_to_token(i) for i in ours],
                [hf.id_to_token(i) for i in ref]))
    return {"case": "tokenizer-" + name, "texts": len(texts),
            "identical": same, "differ_leading_space_or_special": lead,
            "exported_as": rep.get("tokenizer"),
            "note": rep.get("tokenizer_note", "")}


def no_window_copy(src, dst):
    """The fixture with its sliding window removed (same weights)."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    p = os.path.join(dst, "config.json")
    c = json.load(open(p))
    c["sliding_window"] = None
    c["use_sliding_window"] = False
    json.dump(c, open(p, "w"), indent=2)
    return dst


def main():
    cases = []
    stories = os.path.join(SHARED, "models", "stories260k")
    if os.path.isdir(stories):
        ref = os.path.join(stories, "reference")
        ids = [int(x) for x in open(os.path.join(ref, "eval_64x256.ids"))
               .readline().split()][:32]
        calib = os.path.join(ref, "calib_64x256.ids")
        cases += [
            ("stories-f32", stories, [], ids, 512, ()),
            ("stories-int8", stories, ["--quant", "int8"], ids, 512, ()),
            ("stories-int4g32", stories, ["--quant", "int4", "--group", "32"],
             ids, 512, ()),
            ("stories-int4g32-q4_1", stories,
             ["--quant", "int4", "--group", "32"], ids, 512,
             ("--gguf-int4", "q4_1")),
            ("stories-int4g32-q8_0", stories,
             ["--quant", "int4", "--group", "32"], ids, 512,
             ("--gguf-int4", "q8_0")),
            ("stories-int4g128", stories,
             ["--quant", "int4", "--group", "128"], ids, 512, ()),
            ("stories-int4g128-q4_1", stories,
             ["--quant", "int4", "--group", "128"], ids, 512,
             ("--gguf-int4", "q4_1")),
            ("stories-int4g32-calib-rot", stories,
             ["--quant", "int4", "--group", "32", "--calib", calib,
              "--method", "rtn"], ids, 512, ()),
        ]
    else:
        print("stories260k not found in ../shared: skipped")
    fx = os.path.join(BUILD, "fixtures")
    ids = [1] + [(7 * i + 3) % 256 for i in range(31)]
    mistral_nw = no_window_copy(os.path.join(fx, "mistral"),
                                os.path.join(WORK, "mistral-nowindow"))
    qwen2_nw = no_window_copy(os.path.join(fx, "qwen2"),
                              os.path.join(WORK, "qwen2-nowindow"))
    cases += [
        ("llama-f32", os.path.join(fx, "llama"), [], ids, 256, ()),
        ("llama-int8", os.path.join(fx, "llama"), ["--quant", "int8"], ids,
         256, ()),
        ("llama-int4g32", os.path.join(fx, "llama"),
         ["--quant", "int4", "--group", "32"], ids, 256, ()),
        ("llama-int4g64", os.path.join(fx, "llama"),
         ["--quant", "int4", "--group", "64"], ids, 256, ()),
        ("llama-int4g32-q4_1", os.path.join(fx, "llama"),
         ["--quant", "int4", "--group", "32"], ids, 256,
         ("--gguf-int4", "q4_1")),
        ("llama-bias-int8", os.path.join(fx, "llama-bias"),
         ["--quant", "int8"], ids, 256, ()),
        ("mistral-int4g32", os.path.join(fx, "mistral"),
         ["--quant", "int4", "--group", "32"], ids, 256,
         ("--ignore-sliding-window",)),
        ("mistral-nowindow-int4g32", mistral_nw,
         ["--quant", "int4", "--group", "32"], ids, 256, ()),
        ("qwen2-int8", os.path.join(fx, "qwen2"), ["--quant", "int8"], ids,
         256, ("--ignore-sliding-window",)),
        ("qwen2-nowindow-int8", qwen2_nw, ["--quant", "int8"], ids, 256, ()),
        ("qwen2-nowindow-int4g32", qwen2_nw,
         ["--quant", "int4", "--group", "32"], ids, 256, ()),
    ]
    only = sys.argv[1:]
    results, bad = [], 0
    tok_results = []
    for form in tokenizer_forms():
        if only and "tokenizer-" + form[0] not in only and \
                "tokenizers" not in only:
            continue
        try:
            r = tokenizer_case(*form)
        except Exception as e:
            r = {"case": "tokenizer-" + form[0], "error": str(e)[-1500:]}
        tok_results.append(r)
        print(json.dumps(r), flush=True)
    for c in cases:
        if only and c[0] not in only:
            continue
        try:
            r = one_case(*c)
        except Exception as e:  # report and go on with the other cases
            r = {"case": c[0], "error": str(e)[-1500:]}
            bad += 1
        results.append(r)
        print(json.dumps(r), flush=True)
    print("\nKL(ours || engine), mean over the prompt positions, and greedy "
          "ids equal to ours (of 64)")
    print("%-26s %-16s %-16s %-16s %-16s" % (
        "case", "gguf", "gguf as f32", "gguf q vs f32", "c-t"))
    for r in results:
        if "error" in r or "gguf" not in r:
            print("%-26s ERROR %s" % (r["case"], r["error"][:100]))
            continue
        cols = [r[k] for k in ("gguf", "gguf_dequant", "gguf_engine_only",
                               "compressed_tensors")]
        print("%-26s " % r["case"] + " ".join(
            "%.2e %2d/64    " % (c["kld_mean"], c["greedy_same"]) if c
            else "(as without)    " for c in cols))
    if tok_results:
        print("\nllama.cpp's tokenization of our GGUF against Hugging Face "
              "tokenizers (texts identical)")
        for r in tok_results:
            print("%-26s %s" % (r["case"], "ERROR " + r["error"][:100]
                                if "error" in r else
                                "%d/%d (%d of the others start with a space "
                                "or hold a special token)  [%s]%s" % (
                                    r["identical"], r["texts"],
                                    r["differ_leading_space_or_special"],
                                    r["exported_as"], "  " + r["note"]
                                    if r["note"] else "")))
    json.dump(results + tok_results,
              open(os.path.join(WORK, "results.json"), "w"), indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
