"""Time and peak memory of QLoRA training steps: LoRA adapters (every group, rank 8) over a random GPT-2-shaped
model whose matrices and tied embedding are q8_0 blocks, built in memory (no run directory), made ready for training
by the loader as `train finetune` makes it; each step a forward pass with the loss and a backward pass.

    python3 scripts/qlora_step.py [--d-model 512] [--vocab 32000] [--layers 2] [--rows 8] [--tokens 256] [--steps 6]

One thread. Prints the summed loss of the last step, the median wall time of the steps after the first and their
median CPU time (the process's, less sensitive to a loaded machine), and the process's peak RSS (`ru_maxrss`) before the first step and at the end: the steps' own peak is the difference.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from tfcli.adapters import AdapterRecord
from tfcli.adapters.lora import TARGET_GROUPS, apply_lora, check_rank
from tfcli.checkpoint import TIED_KEY, model_from_tensors
from tfcli.loader import prepare
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Loss, Transformer
from tfcli.quant.formats import quantize
from tfcli.quant.tensors import Blocks


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def qlora_model(config: ModelConfig, rank: int) -> Transformer:
    """A random model of `config`, its matrices and embedding q8_0 blocks, with LoRA adapters of `rank` on them."""
    tensors: dict[str, torch.Tensor | Blocks] = {}
    for name, tensor in Transformer(config).state_dict().items():
        if name == TIED_KEY:
            continue  # the embedding's blocks, tied again as the model is built
        in_blocks = tensor.dim() == 2 and name != "pos_emb.weight"
        tensors[name] = Blocks(torch.from_numpy(quantize(tensor.numpy(), "q8_0")), "q8_0", tuple(tensor.shape)) if in_blocks else tensor
    model = model_from_tensors(config, tensors)
    groups = list(TARGET_GROUPS)
    record = AdapterRecord(
        rank=rank,
        alpha=2.0 * rank,
        targets=groups,
        modules=check_rank(config, rank, groups),
        parent="memory",
        parent_path="memory",
        parent_weights_bytes=0,
        parent_weights_sha256="",
    )
    return apply_lora(model, record)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    d = args.d_model
    config = ModelConfig(vocab_size=args.vocab, block_size=args.tokens, n_layers=args.layers, n_heads=max(1, d // 64), d_model=d, d_ff=4 * d)
    model = prepare(qlora_model(config, rank=8), "train", "cpu")
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.rows, args.tokens), generator=generator)
    targets = torch.randint(0, args.vocab, (args.rows, args.tokens), generator=generator)
    before = peak_rss_mb()
    seconds, cpu_seconds = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = model(ids, head=Loss(targets)).loss
        loss.backward()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    later, cpu_later = seconds[1:] or seconds, cpu_seconds[1:] or cpu_seconds
    step = f"step {statistics.median(later):.3f} s (CPU {statistics.median(cpu_later):.3f} s)"
    print(f"loss {loss.item():.6f}  {step}  peak RSS {before:.0f} MB before the steps, {peak_rss_mb():.0f} MB after")


if __name__ == "__main__":
    main()
