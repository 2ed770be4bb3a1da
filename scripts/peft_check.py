"""peft_check.py - the body of scripts/peft-check (see there).

usage: python peft_check.py MCOMPILE WORKDIR [CASE_FILTER]
"""
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file

MCOMPILE, WORK = sys.argv[1], sys.argv[2]
FILTER = sys.argv[3] if len(sys.argv) > 3 else ""
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=160,
             max_position_embeddings=64)


def make_base(arch, dtype):
    torch.manual_seed(1)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False)
        m = transformers.LlamaForCausalLM(cfg)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**SHAPE, tie_word_embeddings=False)
        m = transformers.MistralForCausalLM(cfg)
    else:  # Qwen2 small models tie the output layer to the embedding
        cfg = transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True)
        m = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # weights of a trained model's scale, not 0.02
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return m.to(dtype)


INPUT = torch.arange(3, 150, 7).reshape(1, -1)  # token ids < vocab
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
          "down_proj"]

# name -> (list of (LoraConfig kwargs, weight)), which bases
VARIANTS = {
    "plain": [dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])],
    "rslora": [dict(r=8, lora_alpha=16, use_rslora=True,
                    target_modules=["q_proj", "v_proj"])],
    "rank/alpha patterns": [dict(r=4, lora_alpha=8,
                                 target_modules=["q_proj", "v_proj", "up_proj"],
                                 rank_pattern={"q_proj": 2,
                                               "layers.1.mlp.up_proj": 6},
                                 alpha_pattern={"v_proj": 3})],
    "all-linear": [dict(r=4, lora_alpha=8, target_modules="all-linear")],
    "dora": [dict(r=4, lora_alpha=8, use_dora=True,
                  target_modules=["q_proj", "down_proj"])],
    "dora embedding": [dict(r=4, lora_alpha=8, use_dora=True,
                            target_modules=["embed_tokens", "v_proj"])],
    "modules_to_save lm_head": [dict(r=4, lora_alpha=8, target_modules=["q_proj"],
                                     modules_to_save=["lm_head"])],
    "modules_to_save embed": [dict(r=4, lora_alpha=8, target_modules=["q_proj"],
                                   modules_to_save=["embed_tokens"])],
    "embed+lm_head lora": [dict(r=4, lora_alpha=8,
                                target_modules=["embed_tokens", "lm_head"])],
    "layers_to_transform": [dict(r=4, lora_alpha=8,
                                 target_modules=["gate_proj", "o_proj"],
                                 layers_to_transform=[1],
                                 layers_pattern="layers")],
    "bias all": [dict(r=4, lora_alpha=8, target_modules=["q_proj"], bias="all")],
    "bias lora_only": [dict(r=4, lora_alpha=8, target_modules=["q_proj"],
                            bias="lora_only")],
    "lora_bias": [dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                       lora_bias=True)],
    "regex + exclude": [dict(r=2, lora_alpha=4,
                             target_modules=r".*\.(q_proj|v_proj|down_proj)",
                             exclude_modules=["layers.0.mlp.down_proj"])],
    "two weighted": [dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                     dict(r=2, lora_alpha=2, target_modules=["q_proj", "gate_proj"])],
    "dora after plain": [dict(r=4, lora_alpha=8, target_modules=["q_proj"]),
                         dict(r=2, lora_alpha=4, use_dora=True,
                              target_modules=["q_proj"])],
}
WEIGHTS = {"two weighted": [0.5, -1.25], "dora after plain": [1.0, 0.75]}
# "dora after plain": peft 0.21 takes the DoRA norm over W0 + its own delta
# and scales everything merged so far, m/||W0 + dD|| (W0 + dA + dD), in
# merge_and_unload and in its unmerged forward alike (checked by feeding
# the identity through the unmerged layer: equal to 1e-16).
# lora_bias needs a base bias: only Qwen2 has q/k/v biases
ONLY = {"lora_bias": {"qwen2"}}


def train_like(model, kw, seed):
    """Make the saved adapter non-trivial, as training would."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_magnitude_vector" in n:
                p.mul_(1 + 0.05 * torch.randn_like(p))
            elif "modules_to_save" in n or (kw.get("bias", "none") != "none"
                                            and n.endswith("bias")):
                p.add_(0.05 * torch.randn_like(p))
            elif "lora_" in n and n.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))


def save_adapters(base_dir, dtype, cfgs, out):
    dirs = []
    for k, kw in enumerate(cfgs):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            base_dir, dtype=dtype)
        pm = get_peft_model(model, LoraConfig(init_lora_weights=False, **kw))
        train_like(pm, kw, 10 + k)
        d = os.path.join(out, f"adapter{k}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm.save_pretrained(d)
        dirs.append(d)
    return dirs


def peft_f64(base_dir, dirs, weights):
    """The base in float64 with every adapter loaded (float64) and active,
    adapter k's scaling multiplied by weights[k]."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float64)
    pm = PeftModel.from_pretrained(model, dirs[0], adapter_name="a0",
                                   autocast_adapter_dtype=False)
    for k, d in enumerate(dirs[1:], 1):
        pm.load_adapter(d, adapter_name=f"a{k}", autocast_adapter_dtype=False)
    pm = pm.double()
    names = [f"a{k}" for k in range(len(dirs))]
    for mod in pm.modules():
        if hasattr(mod, "set_scale") and hasattr(mod, "scaling"):
            for k, nm in enumerate(names):
                if nm in mod.scaling:
                    mod.set_scale(nm, weights[k])
    pm.base_model.set_adapter(names)
    pm.eval()
    return pm, names


def peft_merge_f64(base_dir, dirs, weights):
    """PEFT's merge_and_unload in float64, and the unmerged forward's
    logits on a fixed input (computed before merging)."""
    pm, names = peft_f64(base_dir, dirs, weights)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fwd = pm(INPUT).logits
        merged = pm.merge_and_unload(adapter_names=names)
    return merged, fwd


def round_once(x, dtype):
    """float64 tensor -> bits of dtype, one rounding to nearest even."""
    x = x.detach().numpy().astype(np.float64)
    if dtype == torch.float32:
        return x.astype(np.float32).view(np.uint32).astype(np.int64)
    u = x.view(np.uint64).copy()
    lsb = (u >> np.uint64(45)) & np.uint64(1)
    u = (u + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    r = u.view(np.float64)
    tiny = (np.abs(x) < 2.0 ** -126) & (x != 0)
    q = 2.0 ** -133
    r = np.where(tiny, np.rint(x / q) * q, r)
    return (r.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.int64)


def ordered(b, dtype):
    sign = 1 << (31 if dtype == torch.float32 else 15)
    return np.where(b & sign, -(b & ~sign), b)


def bits(t):
    if t.dtype == torch.float32:
        return t.view(torch.int32).numpy().view(np.uint32).astype(np.int64)
    return t.view(torch.int16).numpy().view(np.uint16).astype(np.int64)


def load_quiet(out):
    """Load with transformers; return the warnings it emitted."""
    stream = io.StringIO()
    h = logging.StreamHandler(stream)
    lg = transformers.logging.get_logger()
    lg.addHandler(h)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        transformers.AutoModelForCausalLM.from_pretrained(out)
    lg.removeHandler(h)
    msgs = [str(x.message) for x in w] + [l for l in stream.getvalue().splitlines() if l]
    return msgs


def run_case(arch, dtype, vname, cfgs, root):
    case = os.path.join(root, f"{arch}-{str(dtype)[6:]}-{vname.replace(' ', '_').replace('/', '_')}")
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(case)
    base_dir = os.path.join(case, "base")
    make_base(arch, dtype).save_pretrained(base_dir)
    dirs = save_adapters(base_dir, dtype, cfgs, case)
    weights = WEIGHTS.get(vname, [1.0] * len(dirs))
    out = os.path.join(case, "merged")
    cmd = [MCOMPILE, "merge", base_dir, "-o", out, "--json"]
    for d, w in zip(dirs, weights):
        cmd += ["--lora", f"{d}:{w}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return dict(status="REFUSED", detail=p.stderr.strip()[:160])
    rep = json.loads(p.stdout)
    merged, fwd = peft_merge_f64(base_dir, dirs, weights)
    exp = merged.state_dict()
    with torch.no_grad():
        ours = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float64)(INPUT).logits
        theirs = merged(INPUT).logits
    # how far each merged model's logits are from PEFT's unmerged forward
    fwd_ours = (ours - fwd).abs().max().item()
    fwd_peft = (theirs - fwd).abs().max().item()
    got = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            got.update(load_file(os.path.join(out, f)))
    tied_peft = bool(getattr(merged.config, "tie_word_embeddings", False))
    with open(os.path.join(out, "config.json")) as fh:
        tied_ours = bool(json.load(fh).get("tie_word_embeddings", False))
    maxulp, ndiff, nt = 0, 0, 0
    missing = []
    for name, t in exp.items():
        if name not in got:
            if name == "lm_head.weight" and tied_ours and tied_peft:
                continue
            missing.append(name)
            continue
        g = got[name]
        e = round_once(t, g.dtype)
        d = np.abs(ordered(e, g.dtype) - ordered(bits(g), g.dtype))
        maxulp = max(maxulp, int(d.max()) if d.size else 0)
        ndiff += int((d > 0).sum())
        nt += 1
    extra = [n for n in got if n not in exp]
    warns = load_quiet(out)
    ok = maxulp == 0 and not missing and not extra and tied_ours == tied_peft
    status = "ok" if ok else "DIFF"
    if not ok and fwd_peft > 1e-3 and fwd_ours < 0.1 * fwd_peft:
        status = "DIFF: PEFT's merge is not its forward; ours is"
    return dict(status=status, tensors=nt, max_ulp=maxulp,
                fwd_ours=fwd_ours, fwd_peft=fwd_peft,
                ndiff=ndiff, missing=missing[:3], extra=extra[:3],
                tied=f"{tied_ours}/{tied_peft}",
                untied_report=rep.get("untied_lm_head"), warnings=len(warns),
                warn_text=warns[:2])


def main():
    os.makedirs(WORK, exist_ok=True)
    transformers.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()
    print(f"peft {__import__('peft').__version__}, transformers "
          f"{transformers.__version__}, torch {torch.__version__}")
    print("max ulp / elems !=: mcompile's tensors vs PEFT merge_and_unload "
          "(float64, rounded once); fwd ours / fwd peft: max |logit| "
          "difference of the merged model (ours as written; PEFT's in "
          "float64) from PEFT's unmerged forward (float64)")
    print(f"{'base':8} {'dtype':8} {'variant':24} {'tensors':>7} {'max ulp':>7} "
          f"{'elems !=':>9} {'tied ours/peft':>14} {'fwd ours':>9} "
          f"{'fwd peft':>9} {'warn':>4}  result")
    bad = 0
    for arch in ["llama", "mistral", "qwen2"]:
        for dtype in [torch.float32, torch.bfloat16]:
            for vname, cfgs in VARIANTS.items():
                if arch not in ONLY.get(vname, {arch}):
                    continue
                label = f"{arch} {vname}"
                if FILTER and FILTER not in label:
                    continue
                try:
                    r = run_case(arch, dtype, vname, cfgs, WORK)
                except Exception as ex:  # a PEFT limitation is a row too
                    r = dict(status="PEFT-ERROR", detail=str(ex)[:160])
                if "tensors" in r:
                    print(f"{arch:8} {str(dtype)[6:]:8} {vname:24} {r['tensors']:7d} "
                          f"{r['max_ulp']:7d} {r['ndiff']:9d} {r['tied']:>14} "
                          f"{r['fwd_ours']:9.2e} {r['fwd_peft']:9.2e} "
                          f"{r['warnings']:4d}  {r['status']}"
                          + (f" missing {r['missing']} extra {r['extra']}"
                             if r['missing'] or r['extra'] else "")
                          + (f" {r['warn_text']}" if r['warnings'] else ""),
                          flush=True)
                else:
                    print(f"{arch:8} {str(dtype)[6:]:8} {vname:24} "
                          f"{r['status']}: {r['detail']}", flush=True)
                bad += not r["status"].startswith("ok") and "ours is" not in r["status"] \
                    or r.get("warnings", 0) > 0
    print(f"{bad} case(s) not ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
