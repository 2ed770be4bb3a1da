#!/usr/bin/env python3
"""Write one random Llama-architecture model twice: as a Hugging Face
directory (config.json + model.safetensors, float16) for mcompile and as a
float16 GGUF for llama.cpp, with the SAME weights (the GGUF's q/k rows are
permuted as llama.cpp's convert_hf_to_gguf.py does, so both files describe
the same network).  Used by scripts/bench-vs-llamacpp; not run by CI.

usage: bench-vs-llamacpp-gen.py SHAPE HF_DIR OUT.gguf
  SHAPE: tinyllama (hidden 2048, FFN 5632, 22 layers, 32/4 heads, vocab
         32000, untied) or smollm (hidden 576, FFN 1536, 30 layers, 9/3
         heads, vocab 49152, tied)
Needs numpy and llama.cpp's gguf-py on PYTHONPATH.  Speed does not depend
on the values, so the weights are N(0, 0.02) and the norms 1.  The GGUF
carries a placeholder SentencePiece vocabulary (byte tokens and "t<i>")
because llama.cpp's tools need one; no text is ever tokenized.
"""
import json
import os
import struct
import sys

import numpy as np
import gguf

SHAPES = {
    "tinyllama": dict(hidden=2048, ffn=5632, layers=22, heads=32, kv_heads=4,
                      vocab=32000, tied=False),
    "smollm": dict(hidden=576, ffn=1536, layers=30, heads=9, kv_heads=3,
                   vocab=49152, tied=True),
}


def tensors(s):
    """(hf name, gguf name, shape, kind) in file order."""
    h, f, hd = s["hidden"], s["ffn"], s["hidden"] // s["heads"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    out = [("model.embed_tokens.weight", "token_embd.weight", (s["vocab"], h), "w")]
    for i in range(s["layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (p + "input_layernorm.weight", g + "attn_norm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", g + "attn_q.weight", (q, h), "q"),
            (p + "self_attn.k_proj.weight", g + "attn_k.weight", (kv, h), "k"),
            (p + "self_attn.v_proj.weight", g + "attn_v.weight", (kv, h), "w"),
            (p + "self_attn.o_proj.weight", g + "attn_output.weight", (h, q), "w"),
            (p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (h,), "norm"),
            (p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (f, h), "w"),
            (p + "mlp.up_proj.weight", g + "ffn_up.weight", (f, h), "w"),
            (p + "mlp.down_proj.weight", g + "ffn_down.weight", (h, f), "w"),
        ]
    out.append(("model.norm.weight", "output_norm.weight", (h,), "norm"))
    if not s["tied"]:
        out.append(("lm_head.weight", "output.weight", (s["vocab"], h), "w"))
    return out


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rotate_half -> GGML
    interleaved RoPE)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def value(i, shape, kind):
    if kind == "norm":
        return np.ones(shape, dtype=np.float16)
    rng = np.random.default_rng(1234 + i)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(__doc__)
    name, hf_dir, gguf_path = sys.argv[1:]
    s = SHAPES[name]
    hd = s["hidden"] // s["heads"]
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": s["hidden"], "intermediate_size": s["ffn"],
                   "num_hidden_layers": s["layers"],
                   "num_attention_heads": s["heads"],
                   "num_key_value_heads": s["kv_heads"],
                   "vocab_size": s["vocab"], "max_position_embeddings": 2048,
                   "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "hidden_act": "silu", "tie_word_embeddings": s["tied"],
                   "torch_dtype": "float16", "bos_token_id": 1,
                   "eos_token_id": 2}, f)
    ts = tensors(s)

    # safetensors: header (offsets known up front), then the data in order
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for hf, _, shape, _ in ts:
        n = 2 * int(np.prod(shape))
        header[hf] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    st = open(os.path.join(hf_dir, "model.safetensors"), "wb")
    st.write(struct.pack("<Q", len(hb)) + hb)

    w = gguf.GGUFWriter(gguf_path, "llama")
    w.add_name(f"random-{name}")
    w.add_context_length(2048)
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"t{i}" for i in range(s["vocab"] - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (s["vocab"] - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * s["vocab"])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for _, gn, shape, kind in ts:
        if kind == "norm":
            w.add_tensor_info(gn, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        else:
            w.add_tensor_info(gn, shape, np.dtype(np.float16), 2 * int(np.prod(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (_, _, shape, kind) in enumerate(ts):
        a = value(i, shape, kind)
        st.write(a.tobytes())
        if kind == "q":
            a = permute(a, s["heads"])
        elif kind == "k":
            a = permute(a, s["kv_heads"])
        w.write_tensor_data(a.astype(np.float32) if kind == "norm" else a)
    w.close()
    st.close()


if __name__ == "__main__":
    main()
