"""The device check (``make device-check``): everything that needs a GPU, in one prepared command.

GPU time is scarce, so one command, run once on one GPU (e.g. an H200) in at most 8 minutes,
checks and measures every GPU path and prints one report (also written to
``DIR/device_check.txt`` and ``.json``; DIR is ``--out``, else ``$OUT``, else
``results/device_check``). Parts, each timed, each reported even when another fails:

1. forwards: native LLaDA and Dream forwards on the device against the CPU float32 forward, on
   tiny checkpoints in the real formats (float32 within 1e-4; bfloat16 within 5% of the largest
   logit, with the argmax agreement shown);
2. exactness: the degenerate-setting table of tests/test_exactness.py (every cache, token for
   token against full recompute), run by pytest on the device;
3. compiled steps: Archer's cached forward and the samplers' scoring (LLaDA confidence,
   certainty prior, PC-Sampler) as replayed CUDA graphs (``compile: cuda_graphs``) give the
   eager tokens over prompts of several lengths (a capture per change of length); a capture
   that fails midway runs eagerly and leaves random draws and the next capture working;
4. host syncs: per step, every sampler x cache reads back exactly what its decisions need
   (tests/host_sync.py budgets), counted with ``torch.cuda.set_sync_debug_mode``;
5. the papers' prompt-length table at real LLaDA-8B / Dream-7B shapes, random bf16 weights:
   full step, Archer's cached step (eager and replayed; the replayed one run once under
   ``set_sync_debug_mode("error")``), SPA-Cache's sparse step at budgets 0.05..0.5, in ms with
   speedup and percent of the ideal, P = 128..2048, G = 256; then the peak GPU memory of the
   8B-shaped model and of each cache at P = 2048;
6. campaign: tests/configs/tiny.yaml end to end through Snakemake with ``device: cuda``
   (generation on the GPU, scoring on the CPU); every generate job decoded again on the CPU
   (float32: the same tokens) and with ``--compile cuda_graphs`` (the same tokens);
7. MoE (benchmarks/device_moe.py): the MoE layer against a dense SwiGLU of the same active
   parameters at 32..2048 rows at LLaDA-MoE's and LLaDA2.0-mini's expert counts and top-k, real
   widths in bf16 (benchmarks/bench_moe.py's GPU version); LLaDA2.0-mini's real shapes (all 20
   layers, random bf16 weights) decoding one block with the release loop and with a cache, ms
   per step and peak memory; a tiny LLaDA2.0 model's float32 tokens on the GPU against the CPU;
   batch 2 vs 1 tokens, and the layer's rows and the model's logits alone vs in a batch bit for
   bit on CUDA (reported, not failed);
8. torch.compile: Archer's cached step compiled (``mode="reduce-overhead"``) at P = 2048, in a
   subprocess bounded by the time left less part 9's reserve (``RESERVE_S``);
9. batching: generate-job throughput at batch 16 vs 1 per method family at LLaDA-8B shapes
   (random bf16 weights; goal >= 5x for the cached methods) and the fraction of samples whose
   bf16 tokens equal batch 1's (benchmarks/bench_batching.py), methods begun until the budget's
   end; part 6 also decodes the tiny campaign again in bf16 at batch 1 and 16 and reports
   identical samples and the quality change;
10. floors (issue 48): every figure above as a ratio to its floor, in one table: each cached
   step (Archer eager and replayed, the Fast-dLLM dual cache's, SPA-Cache's) against its roofline
   at LLaDA-8B shapes (the weight-streaming floor at those row counts), the full step over 768
   rows against the matrix peak, a whole decode against the sum of its forwards, batch 16 against
   batch 1 throughput against the ideal 16x, and the MoE layer against its roofline (goal: at
   most 3x from 32 rows), with the matrix rate and copy bandwidth measured in the same run.

Without a GPU the same command runs the CPU-sized version of each part (small shapes, one model
family where the part loops over both, a subset of the exactness table, in part 3 the samplers
tests/test_graphs.py does not capture, each sampler and each cache once in the host-sync part,
a one-method campaign up to its summary; CUDA graphs replaced by tests/host_sync.py's replay
stand-in, host syncs counted by the same file's counter; no memory peak, no torch.compile
part), which tests/test_device_check.py runs, so the script is known to work before GPU time
is spent; its timings say nothing about a GPU.
Exit status 1 when any check fails.

    python benchmarks/device_check.py [--out DIR] [--device auto|cuda|cpu] [--parts ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from device_parts import PARTS  # noqa: E402

BUDGET_S = 480  # the whole GPU run: 8 minutes on one H200
#: what the parts that run to a deadline (8, torch.compile; 9, batching) leave for each selected
#: part still to run after them, in seconds on a GPU: part 9 times its methods for about 90 s
RESERVE_S = {"batching": 90, "floors": 5}


@dataclass
class Check:
    """What the parts share: the device, the report (printed and written as it grows)."""
    device: torch.device
    out: Path
    started: float = field(default_factory=time.perf_counter)
    lines: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    after: tuple[str, ...] = ()  # the selected parts still to run after the current one

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        return BUDGET_S - (time.perf_counter() - self.started)

    def free(self) -> float:
        """The time a part that runs to a deadline may take: what is left of the budget less what
        the parts after it reserve (``RESERVE_S``)."""
        return self.left() - sum(RESERVE_S.get(name, 0) for name in self.after)

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def check(self, ok: bool, what: str) -> bool:
        self.say(f"  [{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            self.failures.append(what)
        return ok

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_check.txt").write_text("\n".join(self.lines) + "\n")
        (self.out / "device_check.json").write_text(json.dumps(self.data, indent=1, default=str))


def header(ck: Check) -> None:
    if ck.gpu:
        p = torch.cuda.get_device_properties(ck.device)
        what = (f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
                f"compute capability {p.major}.{p.minor}; CUDA {torch.version.cuda}")
    else:
        what = f"no GPU: CPU-sized version of every part ({torch.get_num_threads()} threads)"
    ck.say(f"dlmpipe device check: {what}; torch {torch.__version__}; python {sys.version.split()[0]}")
    if ck.gpu:
        ck.say(f"expected on one H200: parts 1-6 about 3-4 minutes (the campaign's Snakemake run the "
               f"longest), part 7 (MoE) about 1-1.5 minutes, part 8 takes what is left of the "
               f"{BUDGET_S} s budget but {RESERVE_S['batching']} s, part 9 (batching) times its "
               f"methods until the budget's end; each part's time is printed with what is left")
    ck.data["device"] = what
    ck.data["torch"] = torch.__version__


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "results" / "device_check"))
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    a = ap.parse_args()
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    ck = Check(device=device, out=Path(a.out))
    if not ck.gpu:
        torch.set_num_threads(1)  # tiny shapes: one thread is fastest and steady on a busy machine
    header(ck)
    timings = {}
    for i, name in enumerate(a.parts):
        title, run = PARTS[name]
        ck.after = tuple(a.parts[i + 1:])
        ck.say("")
        ck.say(f"== {title}")
        t = time.perf_counter()
        try:
            run(ck)
        except Exception:  # a broken part is reported; the others still run
            ck.check(False, f"{name}: raised\n" + traceback.format_exc())
        timings[name] = time.perf_counter() - t
        ck.say(f"  ({name}: {timings[name]:.1f} s" + (f"; {ck.left():.0f} s of the {BUDGET_S} s budget "
                                                      f"left)" if ck.gpu else ")"))
        ck.write()
    total = time.perf_counter() - ck.started
    ck.say("")
    ck.say("== summary")
    ck.say("  time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
           + f"; total {total:.0f} s" + (f" (budget {BUDGET_S} s)" if ck.gpu else ""))
    if ck.gpu and total > BUDGET_S:
        ck.say(f"  over the {BUDGET_S} s budget by {total - BUDGET_S:.0f} s")
    ck.say(f"  {'all checks passed' if not ck.failures else f'{len(ck.failures)} check(s) FAILED'}")
    ck.data["timings_s"] = timings | {"total": total}
    ck.data["failures"] = ck.failures
    ck.write()
    print(f"report: {ck.out / 'device_check.txt'}")
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
