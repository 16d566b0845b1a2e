#!/usr/bin/python3
"""Train, check and export two tiny byte-level Llama models on the King James Bible.

tiny-llama is HuggingFace LlamaForCausalLM math in plain torch; tiny-sinks is the
same model plus gpt-oss's learned per-head attention sink logit. Both see the same
data in the same order with the same seed and hyperparameters.

  /usr/bin/python3 models/train.py --selftest
  /usr/bin/python3 models/train.py --name tiny-llama            # train (fresh)
  /usr/bin/python3 models/train.py --name tiny-llama --resume   # continue from models/.ckpt
  /usr/bin/python3 models/train.py --name tiny-llama --export   # write models/tiny-llama/ from the checkpoint

The corpus comes from Debian's bible-kjv package (`bible -f Gen1:1-Rev22:21`); the
books 2 Corinthians to Revelation are held out (models/heldout/kjv-heldout.txt), the
rest is the training text (regenerated, never committed).
"""

import argparse
import hashlib
import json
import math
import os
import platform
import struct
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_DIR = os.path.join(HERE, ".ckpt")
HELDOUT_PATH = os.path.join(HERE, "heldout", "kjv-heldout.txt")
TRAIN_PATH = os.path.join(CKPT_DIR, "kjv-train.txt")
BIBLE_RANGE = "Gen1:1-Rev22:21"
HELDOUT_FIRST_LINE = "2Cor1:1 "  # held out: 2 Corinthians .. Revelation (whole books, contiguous tail)

BOS = 256
VOCAB = 257

# Architecture and training settings shared by both models; only "sinks" differs.
BASE = dict(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=512,  # = trained context: BOS + 511 bytes as input
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    vocab_size=VOCAB,
    bos_token_id=BOS,
    tie_word_embeddings=False,
)
TRAIN = dict(
    seed=1234,
    batch_size=8,
    steps=1400,
    lr=3e-3,
    min_lr_ratio=0.1,
    warmup_steps=50,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,
    eval_every=50,
    eval_windows=32,
    ckpt_seconds=180,
)
MODELS = {"tiny-llama": False, "tiny-sinks": True}


# ----------------------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(T, head_dim, theta, dtype=torch.float32):
    """HF LlamaRotaryEmbedding (default rope type), computed in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = torch.outer(pos, inv_freq)  # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, c, sinks):
        super().__init__()
        self.nh = c["num_attention_heads"]
        self.nkv = c["num_key_value_heads"]
        self.hd = c["head_dim"]
        H = c["hidden_size"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        if sinks:
            self.sinks = nn.Parameter(torch.zeros(self.nh, dtype=torch.float32))
        else:
            self.sinks = None

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = self.nh // self.nkv  # HF repeat_kv: kv head j serves query heads j*rep .. j*rep+rep-1
        k = k[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        v = v[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        w = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(self.hd)) + mask
        if self.sinks is None:
            # HF upcasts the softmax to float32 (a no-op for this float32 model; float64 kept for the self-test)
            p = F.softmax(w, dim=-1, dtype=torch.promote_types(w.dtype, torch.float32)).to(q.dtype)
        else:
            s = self.sinks.reshape(1, -1, 1, 1).expand(B, -1, T, 1).to(w.dtype)
            comb = torch.cat([w, s], dim=-1)
            comb = comb - comb.max(dim=-1, keepdim=True).values
            p = F.softmax(comb, dim=-1, dtype=comb.dtype)[..., :-1].to(q.dtype)
        o = torch.matmul(p, v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, sinks):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c, sinks)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class Inner(nn.Module):
    def __init__(self, c, sinks):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c, sinks) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c, sinks):
        super().__init__()
        self.c = c
        self.model = Inner(c, sinks)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self._cache = {}

    def init_weights(self, seed):
        # HF Llama init: normal(0, initializer_range=0.02) for linears and embeddings, ones for norms.
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.endswith("sinks"):
                    p.zero_()
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    def _rope_mask(self, T, dtype):
        key = (T, dtype)
        if key not in self._cache:
            cos, sin = rope_cos_sin(T, self.c["head_dim"], self.c["rope_theta"], dtype)
            mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
            self._cache[key] = (cos, sin, mask)
        return self._cache[key]

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        cos, sin, mask = self._rope_mask(ids.shape[1], x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))


# ----------------------------------------------------------------------------- data


def bible_text():
    out = subprocess.run(["bible", "-f", BIBLE_RANGE], check=True, stdout=subprocess.PIPE).stdout
    return out


def corpus():
    """Returns (train_bytes, heldout_bytes); writes the training text and (if absent) the held-out file."""
    full = bible_text()
    cut = full.find(b"\n" + HELDOUT_FIRST_LINE.encode()) + 1
    if cut <= 0:
        sys.exit("held-out split point %r not found in `bible -f %s`" % (HELDOUT_FIRST_LINE, BIBLE_RANGE))
    train, held = full[:cut], full[cut:]
    os.makedirs(CKPT_DIR, exist_ok=True)
    if not os.path.exists(TRAIN_PATH) or open(TRAIN_PATH, "rb").read() != train:
        with open(TRAIN_PATH, "wb") as f:
            f.write(train)
    if os.path.exists(HELDOUT_PATH):
        if open(HELDOUT_PATH, "rb").read() != held:
            sys.exit("%s differs from the held-out part of `bible -f %s`" % (HELDOUT_PATH, BIBLE_RANGE))
    else:
        os.makedirs(os.path.dirname(HELDOUT_PATH), exist_ok=True)
        with open(HELDOUT_PATH, "wb") as f:
            f.write(held)
    return train, held


def batch(data, B, T, gen):
    """B random windows: input = BOS + T-1 bytes, target = those T-1 bytes + the next one."""
    starts = torch.randint(0, len(data) - T + 1, (B,), generator=gen)
    win = torch.stack([data[s : s + T] for s in starts.tolist()])  # [B, T] bytes
    bos = torch.full((B, 1), BOS, dtype=torch.long)
    x = torch.cat([bos, win[:, :-1]], dim=1)
    return x, win


def heldout_windows(held, T, limit=None):
    """Non-overlapping T-byte chunks of the held-out bytes (last one may be shorter), each
    predicted from BOS + its preceding bytes within the chunk."""
    out = []
    for s in range(0, len(held), T):
        chunk = held[s : s + T]
        x = torch.cat([torch.tensor([BOS]), chunk[:-1]])
        out.append((x[None], chunk[None]))
        if limit is not None and len(out) >= limit:
            break
    return out


@torch.no_grad()
def bits_per_byte(model, windows):
    nll, n = 0.0, 0
    for x, y in windows:
        logits = model(x)
        nll += F.cross_entropy(logits.reshape(-1, VOCAB).double(), y.reshape(-1), reduction="sum").item()
        n += y.numel()
    return nll / n / math.log(2), n


# ----------------------------------------------------------------------------- files


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous().cpu()
        b = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    import numpy as np

    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32"
        a, b = meta["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype="<f4").reshape(meta["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def hf_config(sinks):
    c = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
        torch_dtype="float32",
        eos_token_id=None,
        rope_scaling=None,
        use_cache=True,
    )
    c.update(BASE)
    if sinks:
        c["attention_sinks"] = "learned"
    return dict(sorted(c.items()))


def fmt(x):
    return float("%.9g" % x)


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def dpkg_version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True,
                              stdout=subprocess.PIPE).stdout.decode()
    except Exception:
        return "unknown"


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- training


def ckpt_path(name):
    return os.path.join(CKPT_DIR, name + ".pt")


def log(name, msg):
    line = time.strftime("%Y-%m-%d %H:%M:%S ") + msg
    print(line, flush=True)
    with open(os.path.join(CKPT_DIR, name + ".log"), "a") as f:
        f.write(line + "\n")


def lr_at(step, h):
    if step < h["warmup_steps"]:
        return h["lr"] * (step + 1) / h["warmup_steps"]
    p = (step - h["warmup_steps"]) / max(1, h["steps"] - h["warmup_steps"])
    return h["lr"] * (h["min_lr_ratio"] + (1 - h["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def make_optimizer(model, h):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    rest = [p for n, p in model.named_parameters() if p.dim() != 2]  # norms, sinks
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": h["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=1e-8,
    )


def save_ckpt(name, state):
    tmp = ckpt_path(name) + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, ckpt_path(name))


def new_state(name, h):
    sinks = MODELS[name]
    torch.manual_seed(h["seed"])
    model = LlamaForCausalLM(BASE, sinks)
    model.init_weights(h["seed"])
    opt = make_optimizer(model, h)
    gen = torch.Generator().manual_seed(h["seed"] + 1)
    return model, opt, gen, dict(step=0, tokens=0, wall=0.0, losses=[], evals=[])


def load_state(name):
    ck = torch.load(ckpt_path(name))
    h = ck["hparams"]
    model = LlamaForCausalLM(ck["config"], ck["sinks"])
    model.load_state_dict(ck["model"])
    opt = make_optimizer(model, h)
    opt.load_state_dict(ck["optimizer"])
    gen = torch.Generator()
    gen.set_state(ck["data_rng"])
    torch.set_rng_state(ck["torch_rng"])
    return model, opt, gen, ck["progress"], h


def pack(name, model, opt, gen, prog, h):
    return dict(name=name, config=BASE, sinks=MODELS[name], hparams=h, model=model.state_dict(),
                optimizer=opt.state_dict(), data_rng=gen.get_state(), torch_rng=torch.get_rng_state(),
                progress=prog)


def train(args):
    name = args.name
    os.makedirs(CKPT_DIR, exist_ok=True)
    train_bytes, held_bytes = corpus()
    data = torch.tensor(list(train_bytes), dtype=torch.long)
    held = torch.tensor(list(held_bytes), dtype=torch.long)
    T = BASE["max_position_embeddings"]
    if args.resume and os.path.exists(ckpt_path(name)):
        model, opt, gen, prog, h = load_state(name)
        log(name, "resumed at step %d (%.0f s trained)" % (prog["step"], prog["wall"]))
    else:
        if os.path.exists(ckpt_path(name)) and not args.fresh:
            sys.exit("%s exists: pass --resume to continue or --fresh to start over" % ckpt_path(name))
        h = dict(TRAIN)
        if args.steps:
            h["steps"] = args.steps
        if args.batch_size:
            h["batch_size"] = args.batch_size
        model, opt, gen, prog = new_state(name, h)
        nparam = sum(p.numel() for p in model.parameters())
        log(name, "start: %d parameters, sinks=%s, hparams %s, train %d bytes, held-out %d bytes, threads %d"
            % (nparam, MODELS[name], json.dumps(h), len(data), len(held), torch.get_num_threads()))
        if args.export_at_start:
            save_ckpt(name, pack(name, model, opt, gen, prog, h))
    evalw = heldout_windows(held, T, h["eval_windows"])
    last_save = time.time()
    t_mark, tok_mark = time.time(), 0
    model.train()
    while prog["step"] < h["steps"]:
        t0 = time.time()
        step = prog["step"]
        lr = lr_at(step, h)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(data, h["batch_size"], T, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), h["grad_clip"]).item()
        opt.step()
        prog["step"] += 1
        prog["tokens"] += y.numel()
        prog["wall"] += time.time() - t0
        prog["losses"].append(round(loss.item(), 5))
        tok_mark += y.numel()
        if prog["step"] % 10 == 0 or prog["step"] == 1:
            now = time.time()
            log(name, "step %d/%d loss %.4f (%.3f bits/byte) lr %.2e gnorm %.2f tok/s %.0f wall %.0fs"
                % (prog["step"], h["steps"], loss.item(), loss.item() / math.log(2), lr, gnorm,
                   tok_mark / max(1e-9, now - t_mark), prog["wall"]))
            t_mark, tok_mark = now, 0
        if prog["step"] % h["eval_every"] == 0 or prog["step"] == h["steps"]:
            model.eval()
            bpb, n = bits_per_byte(model, evalw)
            model.train()
            prog["evals"].append([prog["step"], round(bpb, 4)])
            log(name, "step %d held-out %.4f bits/byte (first %d bytes)" % (prog["step"], bpb, n))
        if time.time() - last_save >= h["ckpt_seconds"] or prog["step"] == h["steps"]:
            save_ckpt(name, pack(name, model, opt, gen, prog, h))
            last_save = time.time()
            log(name, "checkpoint step %d -> %s" % (prog["step"], ckpt_path(name)))
    log(name, "done: %d steps, %d tokens, %.0f s" % (prog["step"], prog["tokens"], prog["wall"]))
    if not args.no_export:
        export(name)


# ----------------------------------------------------------------------------- export


def export(name, full_eval=True):
    if not os.path.exists(ckpt_path(name)):
        sys.exit("no checkpoint at %s" % ckpt_path(name))
    _, held_bytes = corpus()
    held = torch.tensor(list(held_bytes), dtype=torch.long)
    model, opt, gen, prog, h = load_state(name)
    model.eval()
    sinks = MODELS[name]
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    T = BASE["max_position_embeddings"]

    tensors = dict(model.state_dict())
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    back = read_safetensors(os.path.join(out, "model.safetensors"))
    assert sorted(back) == sorted(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    write_json(os.path.join(out, "config.json"), hf_config(sinks))

    with torch.no_grad():
        ids = torch.cat([torch.tensor([BOS]), held[:64]])[None]
        logits = model(ids)[0]
        long_ids = torch.cat([torch.tensor([BOS]), held[: T - 1]])[None]
        long_logits = model(long_ids)[0]
    long_pos = [0, 1, 63, 64, 255, 256, T - 1]
    ref = {
        "description": "float32 logits of this model (torch, float32) for input_ids = [BOS=256] + the first "
                       "64 bytes of heldout/kjv-heldout.txt; logits[t] is the next-byte distribution after "
                       "input_ids[0..t]. long_* : the same for [BOS] + the first %d held-out bytes, logits "
                       "given only at long_positions." % (T - 1),
        "model": name,
        "step": prog["step"],
        "input_ids": ids[0].tolist(),
        "logits": [[fmt(v) for v in row] for row in logits.tolist()],
        "long_input_ids": long_ids[0].tolist(),
        "long_positions": long_pos,
        "long_logits": [[fmt(v) for v in long_logits[p].tolist()] for p in long_pos],
    }
    # one logits row per line
    text = json.dumps(ref, indent=1)
    for key in ("input_ids", "long_input_ids", "long_positions"):
        text = text.replace(json.dumps(ref[key], indent=1).replace("\n", "\n "), json.dumps(ref[key]), 1)
    for key in ("logits", "long_logits"):
        rows = ",\n  ".join(json.dumps(r) for r in ref[key])
        text = text.replace(json.dumps(ref[key], indent=1).replace("\n", "\n "), "[\n  " + rows + "\n ]", 1)
    with open(os.path.join(out, "reference.json.tmp"), "w") as f:
        f.write(text + "\n")
    assert json.loads(text) == ref
    os.replace(os.path.join(out, "reference.json.tmp"), os.path.join(out, "reference.json"))

    metrics = {"step": prog["step"], "steps_planned": h["steps"], "tokens_seen": prog["tokens"],
               "train_wall_seconds": round(prog["wall"], 1)}
    last = prog["losses"][-50:]
    metrics["final_train_loss_nats"] = round(sum(last) / len(last), 4) if last else None
    if full_eval:
        t0 = time.time()
        bpb, n = bits_per_byte(model, heldout_windows(held, T))
        metrics["heldout_bits_per_byte"] = round(bpb, 4)
        metrics["heldout_bytes"] = n
        metrics["eval_seconds"] = round(time.time() - t0, 1)
    write_json(os.path.join(out, "metrics.json"), metrics)
    write_card(name, out, model, h, prog, metrics)
    msg = "exported step %d to %s" % (prog["step"], out)
    if full_eval:
        msg += ": held-out %.4f bits/byte over %d bytes" % (metrics["heldout_bits_per_byte"], n)
    print(msg)
    if os.path.exists(os.path.join(CKPT_DIR, name + ".log")):
        log(name, msg)


def write_card(name, out, model, h, prog, m):
    sinks = MODELS[name]
    nparam = sum(p.numel() for p in model.parameters())
    c = BASE
    held_sha = hashlib.sha256(open(HELDOUT_PATH, "rb").read()).hexdigest()
    partial = prog["step"] < h["steps"]
    tensors = ["model.embed_tokens.weight  [257, 256]"]
    for n, p in model.state_dict().items():
        if n.startswith("model.layers.0."):
            tensors.append("%s  %s" % (n, list(p.shape)))
    tensors += ["model.norm.weight  [256]", "lm_head.weight  [257, 256]"]
    lines = [
        "# %s" % name,
        "",
        ("A ~%.1fM-parameter byte-level Llama (HuggingFace `LlamaForCausalLM` layout and math)%s, "
         "trained on the King James Bible as a small, real test model for gokv." % (
             nparam / 1e6, " with gpt-oss style learned attention sinks" if sinks else "")),
        "",
    ]
    if partial:
        lines += ["**This export is from an unfinished run (step %d of %d).** Its weights are only good for "
                  "checking file formats and forward passes." % (prog["step"], h["steps"]), ""]
    lines += [
        "## Architecture",
        "",
        "- %d layers, hidden %d, intermediate %d (SwiGLU: `down_proj(silu(gate_proj(x)) * up_proj(x))`)"
        % (c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"]),
        "- %d query heads, %d key/value head (GQA %d:1), head_dim %d, attention scale 1/sqrt(head_dim), causal"
        % (c["num_attention_heads"], c["num_key_value_heads"], c["num_attention_heads"] // c["num_key_value_heads"],
           c["head_dim"]),
        "- RoPE (rotate-half, `cos/sin = cat(freqs, freqs)`, theta %g) on q and k; positions start at 0 (the BOS)"
        % c["rope_theta"],
        "- RMSNorm eps %g, weight only, computed in float32: `x * rsqrt(mean(x^2) + eps) * weight`"
        % c["rms_norm_eps"],
        "- pre-norm residual blocks, final norm, untied `lm_head` (`tie_word_embeddings: false`); no biases",
        "- vocabulary 257: ids 0-255 are bytes, id 256 is BOS (`bos_token_id`), which starts every sequence; "
        "no EOS (`eos_token_id: null`)",
        "- context %d positions (`max_position_embeddings`): BOS + %d bytes" % (c["max_position_embeddings"],
                                                                             c["max_position_embeddings"] - 1),
        "- %d parameters, float32" % nparam,
    ]
    if sinks:
        lines += [
            "- **attention sinks** (marked in config.json as `\"attention_sinks\": \"learned\"`): each layer "
            "has `model.layers.N.self_attn.sinks`, float32 `[%d]`, one logit per query head (initialised to 0). "
            "It is appended as an extra column to that head's scaled, masked attention logits before the softmax "
            "and dropped after, as in gpt-oss: `out = sum_t e^(s_t-m) v_t / (sum_t e^(s_t-m) + e^(sink_h-m))`, "
            "`m = max(max_t s_t, sink_h)`." % c["num_attention_heads"],
        ]
    lines += [
        "",
        "Tensors in `model.safetensors` (float32, HF names; layers 1-%d like layer 0):" % (c["num_hidden_layers"] - 1),
        "",
        "```",
    ] + tensors + [
        "```",
        "",
        "## Corpus",
        "",
        "- Debian package `bible-kjv` %s: `bible -f %s` (one verse a line, e.g. `Ge1:1 In the beginning ...`, "
        "ASCII, references kept), 4,404,412 bytes." % (dpkg_version("bible-kjv"), BIBLE_RANGE),
        "- License: the King James Version text is in the public domain (its copyright expired, per the package's "
        "copyright file); the package's program is GPL-2+, and the verse data file is free for unrestricted use.",
        "- Split by whole books: training text is Genesis through 1 Corinthians; held out is 2 Corinthians through "
        "Revelation, the contiguous tail starting at the line `2Cor1:1`. It is committed as "
        "`models/heldout/kjv-heldout.txt` (%d bytes, sha256 %s); the training text is regenerated from the package "
        "and not committed." % (os.path.getsize(HELDOUT_PATH), held_sha),
        "",
        "## Training",
        "",
        "- Samples: random %d-byte windows of the training text; input = BOS + the first %d bytes, targets = all "
        "%d bytes (so position 0 is always BOS and every byte is predicted)." % (
            c["max_position_embeddings"], c["max_position_embeddings"] - 1, c["max_position_embeddings"]),
        "- AdamW (betas %g/%g, weight decay %g on matrices, none on norms%s), peak lr %g, %d warmup steps, cosine "
        "decay to %g x peak, grad clip %g, batch %d sequences, seed %d. tiny-llama and tiny-sinks use the same "
        "seed, data order and settings; the sinks are the only difference." % (
            h["beta1"], h["beta2"], h["weight_decay"], " and sinks" if sinks else "", h["lr"], h["warmup_steps"],
            h["min_lr_ratio"], h["grad_clip"], h["batch_size"], h["seed"]),
        "- Steps: %d%s; tokens seen: %d." % (prog["step"], " of %d planned" % h["steps"] if partial else "",
                                            prog["tokens"]),
        "- Wall time: %.0f s (%.1f min) on %s, one torch thread (torch %s, OpenBLAS), alongside the other "
        "model and other work." % (prog["wall"], prog["wall"] / 60, cpu_name(), torch.__version__),
        "- Final training loss (mean of the last %d steps): %s nats/byte." % (
            min(50, len(prog["losses"])), m["final_train_loss_nats"]),
    ]
    if "heldout_bits_per_byte" in m:
        lines += [
            "- **Held-out: %.4f bits per byte** (float32). How: the held-out file (%d bytes) is cut into "
            "non-overlapping %d-byte chunks from its start (the last one shorter); each chunk is fed as BOS + its "
            "bytes except the last and every byte of the chunk is scored; bits/byte = total NLL / ln 2 / %d." % (
                m["heldout_bits_per_byte"], m["heldout_bytes"], c["max_position_embeddings"], m["heldout_bytes"]),
        ]
    lines += [
        "",
        "## Files",
        "",
        "- `config.json`: HF Llama config keys%s." % (" plus `\"attention_sinks\": \"learned\"`" if sinks else ""),
        "- `model.safetensors`: standard safetensors (8-byte little-endian header length, JSON header, raw "
        "little-endian float32 data, tensors stored in name order).",
        "- `reference.json`: `input_ids` (BOS + the first 64 held-out bytes, 65 ids) and `logits` [65][257] "
        "float32 from this torch model, for comparing another implementation (relative error 1e-3 is ample); "
        "`long_input_ids` (BOS + first %d held-out bytes) with `long_logits` at `long_positions`."
        % (c["max_position_embeddings"] - 1),
        "- `metrics.json`: the figures above.",
        "",
        "## Retrain",
        "",
        "```",
        "sh models/setup.sh && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 models/train.py "
        "--name %s --fresh" % name,
        "```",
        "",
        "(`models/launch.sh` starts both models in the background; `--resume` continues from "
        "`models/.ckpt/%s.pt`, `--export` rewrites this folder from it.)" % name,
        "",
    ]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


# ----------------------------------------------------------------------------- self-test


def selftest():
    torch.manual_seed(0)
    ok = True

    def check(what, err, tol):
        nonlocal ok
        good = err <= tol
        ok = ok and good
        print("%-60s max err %.3g %s" % (what, err, "ok" if good else "FAIL (tol %g)" % tol))

    c = dict(BASE)
    for sinks in (False, True):
        m = LlamaForCausalLM(c, sinks).double()
        m.init_weights(7)
        with torch.no_grad():
            for layer in m.model.layers:
                for p in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight):
                    p.mul_(1 + 0.1 * torch.randn(p.shape, dtype=p.dtype))
                if sinks:
                    layer.self_attn.sinks.copy_(torch.randn(c["num_attention_heads"], dtype=torch.float64))
        T = 40
        hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        attn = m.model.layers[0].self_attn
        x = torch.randn(1, T, c["hidden_size"], dtype=torch.float64)
        cos, sin, mask = m._rope_mask(T, torch.float64)
        with torch.no_grad():
            got = attn(x, cos, sin, mask)[0]
            # explicit loop: rotate pairs (i, i + hd/2) by angle pos * theta^(-2i/hd), softmax over t <= pos.
            q = attn.q_proj(x)[0].view(T, nh, hd)
            k = attn.k_proj(x)[0].view(T, nkv, hd)
            v = attn.v_proj(x)[0].view(T, nkv, hd)

            def rot(vec, pos):
                # HF computes inv_freq, the angles and cos/sin in float32; do the same per element.
                out = vec.clone()
                for i in range(hd // 2):
                    inv = 1.0 / (c["rope_theta"] ** (torch.tensor(float(2 * i)) / hd))
                    ang = (torch.tensor(float(pos)) * inv).item()
                    ang = torch.tensor(ang, dtype=torch.float32)
                    ca, sa = ang.cos().item(), ang.sin().item()
                    a, b = vec[i].item(), vec[i + hd // 2].item()
                    out[i] = a * ca - b * sa
                    out[i + hd // 2] = b * ca + a * sa
                return out

            qr = torch.stack([torch.stack([rot(q[t, h], t) for h in range(nh)]) for t in range(T)])
            kr = torch.stack([torch.stack([rot(k[t, j], t) for j in range(nkv)]) for t in range(T)])
            heads = torch.zeros(T, nh, hd, dtype=torch.float64)
            for t in range(T):
                for hh in range(nh):
                    j = hh // (nh // nkv)
                    s = torch.stack([qr[t, hh] @ kr[u, j] / math.sqrt(hd) for u in range(t + 1)])
                    if sinks:
                        e = torch.exp(s - torch.max(s.max(), attn.sinks[hh]))
                        den = e.sum() + torch.exp(attn.sinks[hh] - torch.max(s.max(), attn.sinks[hh]))
                    else:
                        e = torch.exp(s - s.max())
                        den = e.sum()
                    heads[t, hh] = (e[:, None] * v[: t + 1, j]).sum(0) / den
            want = attn.o_proj(heads.reshape(T, nh * hd))
        check("attention vs explicit per-position loop (sinks=%s)" % sinks, (got - want).abs().max().item(), 1e-10)

        # RoPE: the score depends only on the position difference.
        qv, kv = torch.randn(hd, dtype=torch.float64), torch.randn(hd, dtype=torch.float64)
        cos, sin = rope_cos_sin(300, hd, c["rope_theta"], torch.float64)
        s1 = apply_rope(qv, cos[10], sin[10]) @ apply_rope(kv, cos[3], sin[3])
        s2 = apply_rope(qv, cos[290], sin[290]) @ apply_rope(kv, cos[283], sin[283])
        check("RoPE relative-position invariance (float32 angles) (sinks=%s)" % sinks,
              abs(s1 - s2).item() / (qv.norm() * kv.norm()).item(), 1e-4)
        # float32 cos/sin table vs the exact angles pos * theta^(-2i/hd)
        pos = torch.arange(512, dtype=torch.float64)[:, None]
        ang = pos * c["rope_theta"] ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
        ang = torch.cat([ang, ang], dim=-1)
        cos, sin = rope_cos_sin(512, hd, c["rope_theta"], torch.float64)
        check("RoPE cos/sin table vs exact formula, 512 positions (sinks=%s)" % sinks,
              max((cos - ang.cos()).abs().max().item(), (sin - ang.sin()).abs().max().item()), 1e-4)

        # causality: changing later tokens leaves earlier logits unchanged.
        ids = torch.randint(0, 256, (2, 64))
        ids[:, 0] = BOS
        ids2 = ids.clone()
        ids2[:, 30:] = torch.randint(0, 256, (2, 34))
        with torch.no_grad():
            a, b = m(ids), m(ids2)
        check("causality: logits before a change are unchanged (sinks=%s)" % sinks,
              (a[:, :30] - b[:, :30]).abs().max().item(), 0.0)
        check("causality: logits after a change do change (sinks=%s)" % sinks,
              -min((a[:, 30:] - b[:, 30:]).abs().max().item(), 1e-3) + 1e-3, 0.0)
        # batched vs one sequence at a time, and a prefix run vs the full run
        with torch.no_grad():
            one = m(ids[1:2])
            pre = m(ids[:, :17])
        check("batch row == single run (sinks=%s)" % sinks, (a[1:2] - one).abs().max().item(), 1e-10)
        check("prefix run == prefix of full run (sinks=%s)" % sinks, (a[:, :17] - pre).abs().max().item(), 1e-10)

    # RMSNorm formula
    n = RMSNorm(8, 1e-5)
    with torch.no_grad():
        n.weight.copy_(torch.randn(8))
    xx = torch.randn(3, 8)
    want = xx / torch.sqrt((xx * xx).mean(-1, keepdim=True) + 1e-5) * n.weight
    check("RMSNorm formula", (n(xx) - want).abs().max().item(), 1e-5)

    # float32 model vs float64 model
    m = LlamaForCausalLM(c, True)
    m.init_weights(3)
    ids = torch.randint(0, 256, (1, 100))
    with torch.no_grad():
        d = (m(ids).double() - m.double()(ids)).abs().max().item()
    check("float32 vs float64 forward", d, 1e-4)

    # safetensors round trip
    import tempfile

    m = LlamaForCausalLM(c, True).float()
    m.init_weights(5)
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "m.safetensors")
        sd = m.state_dict()
        write_safetensors(p, sd)
        back = read_safetensors(p)
        err = max((back[k] - sd[k]).abs().max().item() for k in sd)
        check("safetensors round trip (%d tensors)" % len(sd), err if sorted(back) == sorted(sd) else 1.0, 0.0)
        raw = open(p, "rb").read()
        (hl,) = struct.unpack("<Q", raw[:8])
        hdr = json.loads(raw[8 : 8 + hl])
        names = [k for k in hdr if k != "__metadata__"]
        offs = [hdr[k]["data_offsets"][0] for k in sorted(names)]
        check("safetensors data stored in name order", 0.0 if offs == sorted(offs) else 1.0, 0.0)
    print("selftest", "passed" if ok else "FAILED")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", choices=sorted(MODELS), help="which model")
    ap.add_argument("--resume", action="store_true", help="continue from models/.ckpt/<name>.pt if present")
    ap.add_argument("--fresh", action="store_true", help="start over even if a checkpoint exists")
    ap.add_argument("--export", action="store_true", help="write models/<name>/ from the latest checkpoint")
    ap.add_argument("--no-eval", action="store_true", help="with --export: skip the full held-out evaluation")
    ap.add_argument("--no-export", action="store_true", help="do not export when training finishes")
    ap.add_argument("--export-at-start", action="store_true", help="checkpoint at step 0 (for an early export)")
    ap.add_argument("--steps", type=int, help="total steps (default %d)" % TRAIN["steps"])
    ap.add_argument("--batch-size", type=int, help="sequences per step (default %d)" % TRAIN["batch_size"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--selftest", action="store_true", help="check attention, RoPE, causality, file writer")
    ap.add_argument("--bench", type=int, metavar="N", help="time N training steps (no checkpoint)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.selftest:
        sys.exit(0 if selftest() else 1)
    if not args.name:
        ap.error("--name is required")
    if args.bench:
        h = dict(TRAIN)
        if args.batch_size:
            h["batch_size"] = args.batch_size
        model, opt, gen, _ = new_state(args.name, h)
        data = torch.tensor(list(bible_text()[:1000000]), dtype=torch.long)
        for i in range(args.bench + 1):
            if i == 1:
                t0 = time.time()
            x, y = batch(data, h["batch_size"], BASE["max_position_embeddings"], gen)
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        dt = (time.time() - t0) / args.bench
        print("%s batch %d: %.3f s/step, %.0f tok/s, loss %.3f" % (args.name, h["batch_size"], dt,
                                                                 h["batch_size"] * 512 / dt, loss.item()))
        return
    if args.export:
        export(args.name, full_eval=not args.no_eval)
        return
    train(args)


if __name__ == "__main__":
    main()
