"""A character-level language model on the Python standard library's own source files (no download).

``python -m torch_linrec.examples.lm [--layer mingru|minlstm|mamba|gatedssm] [--mode linear|log]``
trains a small model of :mod:`torch_linrec.nn` layers under ``torch.compile`` with a progress bar,
reports the loss on held-out files, and writes to ``--out`` a loss-curve PNG, a checkpoint and text
sampled token by token with the layers' recurrent ``step`` (constant memory per token).

Data: the ``.py`` files of ``sysconfig.get_paths()["stdlib"]`` (top level, sorted by name) as bytes
(vocabulary 256); the last 10% of the files are the validation set, never trained on. Model:
embedding, ``n_layers`` pre-norm residual blocks (RMSNorm -> layer, RMSNorm -> MLP), RMSNorm,
linear head. Defaults finish in a few minutes on a 2-core CPU; on CUDA a larger model trains longer.
"""
from __future__ import annotations

import argparse
import math
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ..nn import LAYERS

__all__ = ["CharLM", "load_corpus", "main"]

VOCAB = 256
CPU_DEFAULTS = dict(d_model=128, n_layers=2, seq_len=128, batch=16, steps=500, lr=3e-3, data_mb=1.5)
GPU_DEFAULTS = dict(d_model=512, n_layers=6, seq_len=512, batch=32, steps=3000, lr=1.5e-3, data_mb=8.0)


def load_corpus(max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, val)`` uint8 tensors: the stdlib's top-level ``.py`` files in name order, up to
    ``max_bytes`` in all, the last 10% of files held out for validation."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    blobs, total = [], 0
    for f in files:
        data = f.read_bytes()
        blobs.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    n_val = max(1, len(blobs) // 10)
    as_tensor = lambda bs: torch.frombuffer(bytearray(b"".join(bs)), dtype=torch.uint8)  # noqa: E731
    return as_tensor(blobs[:-n_val]), as_tensor(blobs[-n_val:])


def make_layer(kind: str, d_model: int, mode: str) -> nn.Module:
    if kind in ("mingru", "minlstm"):
        return LAYERS[kind](d_model, d_model, mode=mode)
    if kind == "mamba":
        return LAYERS[kind](d_model, d_state=16, expand=2)
    return LAYERS[kind](d_model)


class Block(nn.Module):
    """Pre-norm residual block: ``x + layer(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, kind: str, d_model: int, mode: str):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.layer = make_layer(kind, d_model, mode)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x, state=None):
        y, state = self.layer(self.norm1(x), state, return_state=True)
        x = x + y
        return x + self.mlp(self.norm2(x)), state

    def step(self, x, state):
        y, state = self.layer.step(self.norm1(x), state)
        x = x + y
        return x + self.mlp(self.norm2(x)), state


class CharLM(nn.Module):
    """Byte-level language model of ``n_layers`` blocks of one :mod:`torch_linrec.nn` layer type.

    Args:
        kind: ``"mingru"``, ``"minlstm"``, ``"mamba"`` or ``"gatedssm"``. d_model: width.
        n_layers: blocks. mode: ``"linear"`` or ``"log"`` (minGRU / minLSTM only).
    """

    def __init__(self, kind: str, d_model: int, n_layers: int, mode: str = "linear"):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.blocks = nn.ModuleList(Block(kind, d_model, mode) for _ in range(n_layers))
        self.norm = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` ``(B, L)`` int64 -> logits ``(B, L, 256)``."""
        x = self.embed(tokens)
        for block in self.blocks:
            x, _ = block(x)
        return self.head(self.norm(x))

    def allocate_state(self, batch: int) -> list:
        return [b.layer.allocate_state(batch) for b in self.blocks]

    def step(self, token: torch.Tensor, states: list) -> tuple[torch.Tensor, list]:
        """One token ``(B,)`` -> ``(logits (B, 256), new states)``."""
        x = self.embed(token)
        new = []
        for block, s in zip(self.blocks, states):
            x, s = block.step(x, s)
            new.append(s)
        return self.head(self.norm(x)), new


@torch.no_grad()
def generate(model: CharLM, prompt: bytes, length: int, temperature: float, gen: torch.Generator) -> bytes:
    """Feeds ``prompt`` through ``step``, then samples ``length`` bytes (constant memory per token)."""
    device = next(model.parameters()).device
    states = model.allocate_state(1)
    out = bytearray(prompt)
    logits = None
    for b in prompt:
        logits, states = model.step(torch.tensor([b], device=device), states)
    for _ in range(length):
        probs = torch.softmax(logits.float() / temperature, -1).cpu()
        nxt = int(torch.multinomial(probs[0], 1, generator=gen))
        out.append(nxt)
        logits, states = model.step(torch.tensor([nxt], device=device), states)
    return bytes(out)


def batches(data: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator, device):
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    chunk = data[idx].long().to(device)
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def evaluate(model: nn.Module, val: torch.Tensor, args, device) -> float:
    gen = torch.Generator().manual_seed(1234)  # the same validation batches at every evaluation
    losses = []
    for _ in range(args.eval_batches):
        x, y = batches(val, args.batch, args.seq_len, gen, device)
        losses.append(F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()).item())
    return sum(losses) / len(losses)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_linrec.examples.lm", description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", choices=sorted(LAYERS), default="mingru")
    p.add_argument("--mode", choices=("linear", "log"), default="log", help="scan form of minGRU/minLSTM")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    for name in ("d_model", "n_layers", "seq_len", "batch", "steps"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help="default depends on the device")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--data-mb", type=float, default=None, help="megabytes of source text to read")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--sample-len", type=int, default=300)
    p.add_argument("--no-compile", action="store_true", help="train eagerly")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="autocast dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--out", type=Path, default=Path("lm-out"), help="folder of the PNG, checkpoint and sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for k, v in (GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.manual_seed(args.seed)
    train, val = load_corpus(int(args.data_mb * 2 ** 20))
    model = CharLM(args.layer, args.d_model, args.n_layers, args.mode).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    mode = f" ({args.mode})" if args.layer in ("mingru", "minlstm") else ""
    print(f"{args.layer}{mode}: {args.n_layers} x d_model {args.d_model}, {n_params / 1e6:.2f} M parameters; "
          f"train {train.numel() / 1e6:.2f} MB, validation {val.numel() / 1e6:.2f} MB of stdlib sources; "
          f"{device}, {str(dtype).removeprefix('torch.')}, {'eager' if args.no_compile else 'torch.compile'}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))

    def loss_fn(x, y):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
    step_fn = loss_fn if args.no_compile else torch.compile(loss_fn, fullgraph=True)

    gen = torch.Generator().manual_seed(args.seed)
    curve = {"step": [], "train": [], "val": []}
    val0 = evaluate(model, val, args, device)
    curve["step"].append(0), curve["train"].append(float("nan")), curve["val"].append(val0)
    tokens_per_step = args.batch * args.seq_len
    bar = tqdm(range(1, args.steps + 1), disable=args.no_progress, desc="train", unit="step")
    t0, train_time, ema = time.perf_counter(), 0.0, None
    for step in bar:
        t_step = time.perf_counter()
        x, y = batches(train, args.batch, args.seq_len, gen, device)
        loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step > 2:  # after the compiles of the first steps
            train_time += time.perf_counter() - t_step
        if step % args.eval_every == 0 or step == args.steps:
            v = evaluate(model, val, args, device)
            curve["step"].append(step), curve["train"].append(ema), curve["val"].append(v)
            bar.write(f"step {step:5d}  train {ema:.3f}  val {v:.3f}")
        bar.set_postfix(loss=f"{ema:.3f}")
    elapsed = time.perf_counter() - t0
    tok_s = tokens_per_step * max(1, args.steps - 2) / max(train_time, 1e-9)
    print(f"validation loss {val0:.3f} -> {curve['val'][-1]:.3f} nats/byte ({curve['val'][-1] / math.log(2):.3f} "
          f"bits/byte) in {elapsed:.0f} s; training {tok_s:,.0f} tokens/s (steps after the second, without evaluation)")

    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"lm-{args.layer}"
    torch.save({"model": model.state_dict(), "args": vars(args) | {"out": str(args.out)}, "curve": curve},
               args.out / f"{stem}.pt")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(curve["step"][1:], curve["train"][1:], label="train (EMA)")
    ax.plot(curve["step"], curve["val"], marker="o", label="validation (held-out files)")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/byte)", title=f"{args.layer}{mode} on stdlib sources")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / f"{stem}.png", dpi=120)
    plt.close(fig)
    model.eval()
    text = generate(model, b"def ", args.sample_len, 0.8, torch.Generator().manual_seed(args.seed))
    sample = text.decode("utf-8", errors="replace")
    (args.out / f"{stem}-sample.txt").write_text(sample)
    print(f"wrote {args.out / (stem + '.png')}, {args.out / (stem + '.pt')}, {args.out / (stem + '-sample.txt')}")
    print("sample (generated with step):\n" + sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
