"""CPU, at tree 49fcf91 (which has LAZY_RESCALE): compile the prefill Triton kernel's 64 x 32 tile (2 stages, 4 warps,
bf16, GQA 32/8, D 128) for sm_90 at LAZY_RESCALE 0 and 1, disassemble it with Triton's nvdisasm and count the
instructions of the unmasked key-block loop (sass_counts.txt):

    git worktree add /tmp/wt49 49fcf91 && cd /tmp/wt49
    PYTHONPATH=$PWD python benchmarks/short_prefill/run7_lazy/sass_counts.py
"""

import glob
import re
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernel_gym.kernels import prefill_attention as pa

NVDISASM = glob.glob(sys.prefix + "/lib/python3*/site-packages/triton/backends/nvidia/bin/nvdisasm")[0]
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/")
BM, BN, D, TY = 64, 32, 128, "bf16"


def sass(lazy: int) -> tuple[list[str], int]:
    sig = {"Q": f"tensordesc<{TY}[{BM}, {D}]>", "K": f"tensordesc<{TY}[{BN}, {D}]>",
           "V": f"tensordesc<{TY}[{BN}, {D}]>", "O": f"*{TY}"}
    sig |= {n: "*i32" for n in ("W_START", "W_LEN", "W_BLOCK", "W_HEAD")}
    sig["qk_scale"] = "fp32"
    for n in ("q", "k", "v", "o"):
        sig |= {f"stride_{n}t": "i32", f"stride_{n}h": "i32"}
    constexprs = dict(GROUP=4, HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, USE_TMA=True, PACK_GQA=False, LAZY=bool(lazy))
    sig |= {n: "constexpr" for n in constexprs}
    names = pa._prefill_fwd.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t.startswith("*") or (n.startswith("stride") and n.endswith("t"))}
    kernel = triton.compile(ASTSource(pa._prefill_fwd, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=4, num_stages=2))
    path = f"/tmp/lazy{lazy}.cubin"
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    text = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, check=True).stdout
    return text.splitlines(), kernel.metadata.shared


def main() -> None:
    for lazy in (0, 1):
        lines, shared = sass(lazy)
        labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:", line)}
        branches = [(i, f".L_x_{m.group(1)}") for i, line in enumerate(lines)
                    if "BRA" in line and (m := re.search(r"\(\.L_x_(\d+)\)", line))]
        # the first long backward branch closes the unmasked key-block loop
        start, end = next((labels[t], i) for i, t in branches if labels.get(t, i) < i and i - labels[t] > 150)
        body = [line for line in lines[start:end + 1] if INSTRUCTION.search(line)]
        # a forward branch inside the loop skips a block (LAZY_RESCALE's rescale): the instructions it skips
        skipped = max((sum(1 for line in lines[i + 1:labels[t]] if INSTRUCTION.search(line))
                       for i, t in branches if start < i < end and i < labels.get(t, -1) <= end), default=0)
        fmul = sum(1 for line in body if re.search(r"\sFMUL\s", line))
        bars = sum(1 for line in body if "BAR.SYNC" in line)
        print(f"LAZY_RESCALE={lazy}: unmasked key-block loop {len(body)} instructions (FMUL {fmul}, BAR.SYNC {bars}), "
              f"{len(body) - skipped} when its skippable block ({skipped}) is skipped; shared {shared} B")


if __name__ == "__main__":
    main()
