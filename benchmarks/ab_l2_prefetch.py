"""A/B (not committed): two builds by backend name, same operands, weights rotated past L2, interleaved
base/new medians. python benchmarks/ab_l2_prefetch.py BASE_BUILD NEW_BUILD OUT.json"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemm_peers as grid  # noqa: E402
from kernels import get_local_kernel  # noqa: E402

base_dir, new_dir, out_path = sys.argv[1:4]
builds = {"base": get_local_kernel(Path(base_dir).resolve()), "new": get_local_kernel(Path(new_dir).resolve())}
fp4 = builds["base"]
l2 = grid.l2_bytes("cuda")
CASES = [  # backend, a_format, b_format, m, n, k
    *[("sm90_swap_ab", "bf16", "nvfp4", m, n, k) for m in (16, 64, 256) for n, k in ((17408, 5120), (8192, 8192), (4096, 7168))],
    ("sm90_swap_ab", "bf16", "mxfp4", 64, 17408, 5120),
    *[("sm90_engine", "nvfp4", "nvfp4", m, n, k) for m in (64, 256) for n, k in ((17408, 5120), (4096, 7168), (7168, 2048))],
    ("sm90_engine", "mxfp8", "mxfp8", 256, 17408, 5120),
    ("sm90_engine", "bf16", "nvfp4", 64, 17408, 5120),
    ("sm90_engine", "nvfp4", "nvfp4", 2048, 8192, 8192),
]
rows = []
for backend, fa, fb, m, n, k in CASES:
    mode = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4", "mxfp8": "w8a8-mxfp8"}
    w, sfw = fp4.group_wise_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), mode[fb])
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, sfa = (x, None) if fa == "bf16" else fp4.group_wise_quant(x, mode[fa])
    copies = grid.rotation_copies((w, sfw), l2)
    row = {"backend": backend, "a": fa, "b": fb, "M": m, "N": n, "K": k}
    outs = {}
    fns = {}
    for name, lib in builds.items():
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)

        def call(wc, sc, lib=lib, out=out):
            lib._gemm.GemmCall(a, wc, sfa, sc, fa, fb, out=out).run_on(backend)

        call(w, sfw)
        torch.cuda.synchronize()
        outs[name] = out.clone()
        fns[name] = grid.Rotation(call, copies)
    row["bitwise_equal"] = bool(torch.equal(outs["base"].view(torch.int16), outs["new"].view(torch.int16)))
    times = {"base": [], "new": []}
    for _ in range(3):
        for name in ("base", "new"):
            times[name].append(grid.median_us(fns[name], warmup=10, rep=60))
    row["base_us"], row["new_us"] = min(times["base"]), min(times["new"])
    row["new_over_base"] = row["new_us"] / row["base_us"]
    print({kk: round(v, 3) if isinstance(v, float) else v for kk, v in row.items()}, flush=True)
    rows.append(row)
Path(out_path).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
