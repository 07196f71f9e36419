"""Smoke tests of the example language model (python -m torch_linrec.examples.lm) and of the layers
benchmark (python -m torch_linrec layers): tiny sizes, eager, on the CPU."""
from __future__ import annotations

import csv
import math

import pytest
import torch

from torch_linrec.__main__ import _main
from torch_linrec.examples import lm


def test_corpus_split_is_held_out():
    train, val = lm.load_corpus(200_000)
    assert train.dtype == torch.uint8 and train.numel() > 0 and val.numel() > 0
    assert bytes(val[:200].tolist()) not in bytes(train.tolist())


@pytest.mark.parametrize("layer", ["mingru", "mamba"])
def test_lm_runs_and_writes_outputs(layer, tmp_path, capsys):
    argv = ["--layer", layer, "--steps", "3", "--d-model", "16", "--n-layers", "1", "--seq-len", "16", "--batch", "2",
            "--data-mb", "0.1", "--eval-every", "2", "--eval-batches", "1", "--sample-len", "8", "--no-compile",
            "--no-progress", "--out", str(tmp_path), "--device", "cpu"]
    assert lm.main(argv) == 0
    out = capsys.readouterr().out
    assert "validation loss" in out and "sample (generated with step)" in out
    for suffix in (".png", ".pt", "-sample.txt"):
        assert (tmp_path / f"lm-{layer}{suffix}").stat().st_size > 0
    ckpt = torch.load(tmp_path / f"lm-{layer}.pt")
    assert len(ckpt["curve"]["val"]) == 3 and all(math.isfinite(v) for v in ckpt["curve"]["val"])
    model = lm.CharLM(layer, 16, 1)
    model.load_state_dict(ckpt["model"])
    tokens = torch.randint(0, 256, (1, 6))
    with torch.no_grad():  # parallel logits equal those of step-by-step decoding
        states = model.allocate_state(1)
        steps = []
        for t in range(6):
            logits, states = model.step(tokens[:, t], states)
            steps.append(logits)
        torch.testing.assert_close(torch.stack(steps, 1), model(tokens), rtol=1e-4, atol=1e-4)


def test_layers_benchmark_quick(tmp_path, capsys):
    assert _main(["layers", "--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(next(tmp_path.glob("layers-*.csv")))))
    assert {r["layer"] for r in rows} == {"mingru-linear", "mingru-log", "minlstm-linear", "minlstm-log", "gatedssm",
                                          "mamba"}
    assert all(float(r["fwd_bwd_tokens_per_s"]) > 0 for r in rows)
