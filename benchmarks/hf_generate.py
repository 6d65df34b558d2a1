"""Greedy ``generate`` of a transformers Llama on 8 CPU devices: programs compiled per call and time per token.

The model is the Llama of ``hf_step.py`` (4 layers, hidden 128, GQA, vocabulary 512), the prompt 8 x 16 tokens
without padding, sharded on the batch over an ``(8,)`` mesh. Each call passes a ``transformers.StaticCache`` of
a fixed size, so that a longer answer needs no new cache shape. After a warm-up call, calls of several lengths are
made in turn (each length ``--rounds`` times, interleaved); for each the script prints the programs compiled and
run (``xs.metrics()``), and the milliseconds per new token against torch's own CPU eager ``generate`` in the same
process, whose tokens ours must equal.

With ``--padded``, half the prompts start with three pad tokens and the call passes their attention mask:
transformers then appends a column to the mask per token and pads it to the cache's length; that padded mask
is computed on the host and read by the decode step as an input of one shape (docs/models.md, "Generation").

Why: a decode step must not be a new program per token (issue 29). The counts are the behaviour; the times
measure only (never asserted). Padded or not, the warm-up call compiles two programs (the prefill and the decode
step: transformers' checks on the prompt are computed on the host) and a warm call of any length compiles
nothing: the decode step is one program and the final ``input_ids`` is put together on the host. PyTorch/XLA 2.9
and torchax are not run here (their generate paths need their own environments); the issue's figure for
PyTorch/XLA 2.9 with a static cache was 22 compiles for 8 tokens.

Run: python benchmarks/hf_generate.py [--lengths 8,16,32] [--rounds 2] [--padded]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, random weights: nothing to download

import torch  # noqa: E402
import transformers  # noqa: E402

import pjrt_plugins.spmd as xs  # noqa: E402
from _measure import Table  # noqa: E402
from hf_step import build_model  # noqa: E402

PROMPT = 16
BATCH = 8
CACHE = 128


def generate(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, cache: bool,
             mask: torch.Tensor | None = None) -> torch.Tensor:
    # use_cache: hf_step's config turns the cache off (for training), and generate follows the config.
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                   use_cache=True, attention_mask=mask)
    if cache:
        options["cache"] = transformers.StaticCache(config=model.config, max_cache_len=CACHE)
    return model.generate(prompt, **options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8,16,32", help="comma-separated numbers of new tokens")
    parser.add_argument("--rounds", type=int, default=2, help="calls per length (interleaved)")
    parser.add_argument("--padded", action="store_true", help="pad half the prompts and pass the attention mask")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]

    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    mesh = xs.Mesh(range(8), (8,), ("data",))
    ref = build_model().eval()
    model = copy.deepcopy(ref).to("pjrt")
    prompt = torch.randint(1, ref.config.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    mask = mask_p = None
    if args.padded:
        mask = torch.ones_like(prompt)
        mask[: BATCH // 2, :3] = 0
        prompt = prompt * mask  # pad token 0
        mask_p = xs.mark_sharding(mask.to("pjrt"), mesh, ("data", None))
    sharded = xs.mark_sharding(prompt.to("pjrt"), mesh, ("data", None))
    print(f"Llama {ref.config.num_hidden_layers} layers, hidden {ref.config.hidden_size}, prompt {BATCH}x{PROMPT}"
          f"{' (half padded)' if args.padded else ''}, static cache of {CACHE}, 8 CPU devices; "
          f"load {' '.join(f'{v:.2f}' for v in os.getloadavg())}")

    before = xs.metrics()
    start = time.perf_counter()
    generate(model, sharded, 4, True, mask_p).cpu()
    after = xs.metrics()
    print(f"warm-up (4 new tokens): {after.compiles - before.compiles} programs compiled, "
          f"{after.executions - before.executions} run, {time.perf_counter() - start:.1f} s")

    ours: dict[int, list[float]] = {n: [] for n in lengths}
    cpu: dict[int, list[float]] = {n: [] for n in lengths}
    compiles: dict[int, list[int]] = {n: [] for n in lengths}
    runs: dict[int, list[int]] = {n: [] for n in lengths}
    for _ in range(args.rounds):
        for n in lengths:
            before = xs.metrics()
            start = time.perf_counter()
            tokens = generate(model, sharded, n, True, mask_p).cpu()
            ours[n].append((time.perf_counter() - start) / n)
            after = xs.metrics()
            compiles[n].append(after.compiles - before.compiles)
            runs[n].append(after.executions - before.executions)
            start = time.perf_counter()
            want = generate(ref, prompt, n, False, mask)
            cpu[n].append((time.perf_counter() - start) / n)
            if not torch.equal(tokens, want):
                raise SystemExit(f"{n} new tokens: ours differ from CPU eager's")

    table = Table([("new tokens", 10, ""), ("compiled", 9, "d"), ("compiled again", 15, "d"), ("programs run", 13, "d"),
                   ("ours ms/token", 14, ".1f"), ("CPU eager ms/token", 19, ".1f")])
    print(table.header())
    for n in lengths:
        print(table.row(str(n), compiles[n][0], sum(compiles[n][1:]), runs[n][0],
                        1e3 * statistics.median(ours[n]), 1e3 * statistics.median(cpu[n])))
    print("tokens equal to CPU eager's in every call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
