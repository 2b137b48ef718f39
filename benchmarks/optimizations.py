"""Micro-benchmarks of perfguard's three serving optimizations, optimized vs reference.

For each optimization: wall time (median and IQR of N repeats, the two variants
interleaved A B A B ... so drift hits both equally) and the peak of extra memory allocated
while the variant runs (CUDA: ``max_memory_allocated``; CPU: replayed from
``torch.profiler(profile_memory=True)`` allocation/free events).

  (a) glm_prior_drop_inplace  prior-drop op on a [B, S, D] embedding: in place vs masked_fill
  (b) qwen_modulation_cache   one CFG step (cond + uncond, shared timestep) of Qwen `small`
  (c) qwen_varlen_host_meta   varlen metadata for a padded joint [txt ; img] batch
  (d) each toggle in the whole pipeline (the real Qwen-Image / GLM-Image stages, smoke
      cases): e2e and the stage the optimization lives in, optimized vs reference, with
      the pipeline's counters showing that the optimized path engaged

On CUDA it also counts device->host syncs per denoising step with
``torch.cuda.set_sync_debug_mode("warn")``. CPU run: ``python benchmarks/optimizations.py``
(< 60 s on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from perfguard.workloads.attention import (
    build_varlen_mask_meta,
    build_varlen_mask_meta_from_ranges,
    joint_txt_img_ranges,
)
from perfguard.workloads.presets import build_model, get_preset


@dataclass
class Row:
    optimization: str
    case: str
    variant: str
    median_ms: float
    iqr_ms: float
    peak_mib: float
    note: str = ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ab(
    fn_a: Callable[[], object],
    fn_b: Callable[[], object],
    repeats: int,
    device: torch.device,
    warmup: int = 2,
) -> tuple[list[float], list[float]]:
    """Interleaved A B A B ... timings in ms."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a: list[float] = []
    times_b: list[float] = []
    for _ in range(repeats):
        for fn, out in ((fn_a, times_a), (fn_b, times_b)):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            out.append((time.perf_counter() - start) * 1e3)
    return times_a, times_b


def peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated on top of what was live before ``fn`` (its result is dropped)."""
    if device.type == "cuda":
        _sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        _sync(device)
        del out
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out
    # Each op's *self* allocations happen inside it (count them at its start), frees are
    # either "[memory]" events or negative self usage (count them at the end).
    deltas = []
    for ev in prof.events():
        usage = ev.self_cpu_memory_usage
        if usage:
            deltas.append((ev.time_range.start if usage > 0 else ev.time_range.end, usage))
    current = peak = 0
    for _, usage in sorted(deltas):
        current += usage
        peak = max(peak, current)
    return peak


def _stats(times: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), q[2] - q[0]


def _pair_rows(
    optimization: str,
    case: str,
    names: tuple[str, str],
    fns: tuple[Callable[[], object], Callable[[], object]],
    repeats: int,
    device: torch.device,
    note: str = "",
) -> list[Row]:
    times = time_ab(fns[0], fns[1], repeats, device)
    rows = []
    for name, fn, ts in zip(names, fns, times, strict=True):
        median, iqr = _stats(ts)
        peak = peak_extra_bytes(fn, device) / 2**20
        rows.append(Row(optimization, case, name, median, iqr, peak))
    ratio = rows[1].median_ms / rows[0].median_ms if rows[0].median_ms else float("nan")
    rows[0].note = f"ref/opt time {ratio:.2f}x" + (f"; {note}" if note else "")
    return rows


# ----------------------------------------------------------------------------------------
# (a) glm_prior_drop_inplace
# ----------------------------------------------------------------------------------------


def bench_prior_drop(args: argparse.Namespace, device: torch.device) -> list[Row]:
    b, s, d = args.prior_shape
    emb = torch.randn(b, s, d, device=device)
    patterns = {
        "cond (none dropped)": torch.zeros(b, s, dtype=torch.bool, device=device),
        "uncond (all dropped)": torch.ones(b, s, dtype=torch.bool, device=device),
        "random 50% dropped": torch.rand(b, s, device=device) < 0.5,
    }
    rows: list[Row] = []
    for case, drop in patterns.items():

        def inplace(drop: torch.Tensor = drop) -> None:
            emb[drop] *= 0.0  # values don't matter for timing; the op's work does

        def masked_fill(drop: torch.Tensor = drop) -> torch.Tensor:
            return emb.masked_fill(drop.unsqueeze(-1), 0)

        rows += _pair_rows(
            "glm_prior_drop_inplace",
            f"{b}x{s}x{d} fp32, {case}",
            ("in-place x[m]*=0", "masked_fill (ref)"),
            (inplace, masked_fill),
            args.repeats,
            device,
        )
    return rows


# ----------------------------------------------------------------------------------------
# (b) qwen_modulation_cache
# ----------------------------------------------------------------------------------------


def _mod_params(config: dict) -> int:
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    return config["num_layers"] * 2 * (dim * 6 * dim + 6 * dim)  # img_mod + txt_mod


def bench_modulation_cache(args: argparse.Namespace, device: torch.device) -> list[Row]:
    model = build_model("qwen_image", args.qwen_preset, device=device, seed=0)
    cfg = model.config
    g = torch.Generator(device="cpu").manual_seed(0)
    h = w = args.qwen_grid
    txt = args.qwen_txt
    inputs = dict(
        hidden_states=torch.randn(1, h * w, cfg.in_channels, generator=g).to(device),
        img_shapes=[[(1, h, w)]],
    )
    cond = torch.randn(1, txt, cfg.joint_attention_dim, generator=g).to(device)
    uncond = torch.randn(1, txt, cfg.joint_attention_dim, generator=g).to(device)

    def step(cache: bool) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        def run() -> tuple[torch.Tensor, torch.Tensor]:
            model.qwen_modulation_cache = cache
            t = torch.full((1,), 0.5, device=device)  # one tensor object for both passes
            a = model(**inputs, encoder_hidden_states=cond, timestep=t).sample
            b = model(**inputs, encoder_hidden_states=uncond, timestep=t).sample
            return a, b

        return run

    on, off = step(True), step(False)
    with torch.inference_mode():
        ref_out, opt_out = off(), on()
        assert all(torch.equal(x, y) for x, y in zip(ref_out, opt_out, strict=True))
        skipped = _mod_params(get_preset("qwen_image", args.qwen_preset))
        full = _mod_params(get_preset("qwen_image", "full"))
        note = (
            f"uncond pass skips {skipped / 1e6:.1f}M mod params here, "
            f"{full / 1e9:.2f}B ({full * 2 / 1e9:.1f} GB bf16) at full"
        )
        return _pair_rows(
            "qwen_modulation_cache",
            f"{args.qwen_preset}, 1 CFG step, img {h}x{w} + txt {txt}",
            ("cache on", "cache off (ref)"),
            (on, off),
            args.model_repeats,
            device,
            note,
        )


# ----------------------------------------------------------------------------------------
# (c) qwen_varlen_host_meta
# ----------------------------------------------------------------------------------------


def bench_varlen_meta(args: argparse.Namespace, device: torch.device) -> list[Row]:
    txt_len, img_len = args.varlen_txt, args.varlen_img
    lens = [txt_len, txt_len // 3]  # one full prompt, one padded
    txt_mask = (torch.arange(txt_len)[None, :] < torch.tensor(lens)[:, None]).to(device)

    def host() -> object:
        ranges = joint_txt_img_ranges(lens, txt_len, img_len)
        return build_varlen_mask_meta_from_ranges(ranges, txt_len + img_len, device)

    def from_mask() -> object:
        img_mask = torch.ones(len(lens), img_len, dtype=torch.bool, device=device)
        return build_varlen_mask_meta(torch.cat([txt_mask, img_mask], dim=1))

    with torch.inference_mode():
        return _pair_rows(
            "qwen_varlen_host_meta",
            f"B=2, txt {txt_len} (lens {lens}) + img {img_len}",
            ("host ranges", "device mask (ref)"),
            (host, from_mask),
            args.repeats,
            device,
        )


# ----------------------------------------------------------------------------------------
# CUDA: device syncs per denoising step
# ----------------------------------------------------------------------------------------


def count_syncs(fn: Callable[[], object]) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def bench_syncs(args: argparse.Namespace, device: torch.device) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    qwen = build_model("qwen_image", args.qwen_preset, device=device, seed=0)
    cfg = qwen.config
    h = w = args.qwen_grid
    txt = args.qwen_txt
    lens = [txt // 2]
    mask = (torch.arange(txt)[None, :] < torch.tensor(lens)[:, None]).to(device)
    x = torch.randn(1, h * w, cfg.in_channels, device=device)
    e = torch.randn(1, txt, cfg.joint_attention_dim, device=device)
    for host_meta in (True, False):
        qwen.qwen_varlen_host_meta = host_meta

        def qwen_step() -> None:
            t = torch.full((1,), 0.5, device=device)
            for _ in range(2):  # cond + uncond
                qwen(
                    hidden_states=x,
                    encoder_hidden_states=e,
                    encoder_hidden_states_mask=mask,
                    txt_seq_lens=lens,
                    timestep=t,
                    img_shapes=[[(1, h, w)]],
                )

        with torch.inference_mode():
            qwen_step()  # warm caches (RoPE tables) first
            out.append(("qwen_varlen_host_meta", f"host_meta={host_meta}", count_syncs(qwen_step)))

    glm = build_model("glm_image", args.qwen_preset, device=device, seed=0)
    gcfg = glm.config
    seq = (args.glm_latent // 2) ** 2
    ids = torch.randint(0, gcfg.prior_vq_quantizer_codebook_size, (1, seq), device=device)
    kw = dict(
        hidden_states=torch.randn(
            1, gcfg.in_channels, args.glm_latent, args.glm_latent, device=device
        ),
        encoder_hidden_states=torch.randn(1, 16, gcfg.text_embed_dim, device=device),
        prior_token_id=ids,
        timestep=torch.full((1,), 500.0, device=device),
        target_size=torch.tensor([[1024.0, 1024.0]], device=device),
        crop_coords=torch.zeros(1, 2, device=device),
    )
    for inplace in (True, False):
        glm.glm_prior_drop_inplace = inplace

        def glm_step() -> None:
            for value in (False, True):  # cond (keep all) + uncond (drop all)
                drop = torch.full_like(ids, value, dtype=torch.bool)
                glm(**kw, prior_token_drop=drop)

        with torch.inference_mode():
            glm_step()
            out.append(("glm_prior_drop_inplace", f"inplace={inplace}", count_syncs(glm_step)))
    return out


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------


_PIPELINE_TOGGLES = (
    ("qwen_modulation_cache", "qwen_image_t2i_smoke"),
    ("qwen_varlen_host_meta", "qwen_image_t2i_smoke"),
    ("glm_prior_drop_inplace", "glm_image_t2i_smoke"),
)


def bench_pipeline(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Whole pipeline calls (every stage real), optimized and reference interleaved.

    The micro-benchmarks above isolate the op; this shows what is left of it in a request,
    where the text encoder, the AR prior and the VAE take their share. Counters come from
    the last optimized call (`pipeline.counters()`).
    """
    from pathlib import Path

    from perfguard.device.platform import Platform
    from perfguard.device.timer import StageTimer
    from perfguard.storage.cases import load_registry
    from perfguard.workloads.registry import build_pipeline

    platform = Platform(name="cuda" if device.type == "cuda" else "cpu")
    cases = {c.id: c for c in load_registry(platform.name, Path(__file__).parent.parent / "cases")}
    rows = []
    for toggle, case_id in _PIPELINE_TOGGLES:
        case = cases[case_id]
        pipes = {
            on: build_pipeline(case.with_toggles(**{toggle: on}), platform) for on in (True, False)
        }
        stage_name = "DenoisingStage"
        times: dict[bool, list[float]] = {True: [], False: []}
        stages: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.pipeline_repeats + 1):
            for on in (True, False) if i % 2 else (False, True):
                with StageTimer(platform) as timer:
                    pipes[on]()
                record = timer.record()
                if i:  # the first round warms up
                    times[on].append(record.e2e_ms)
                    stages[on].append(record.stages_ms[stage_name])
        counters = ", ".join(f"{k}={v}" for k, v in pipes[True].counters().items())
        for on in (True, False):
            med, iqr = _stats(times[on])
            smed, _ = _stats(stages[on])
            note = f"{stage_name} {smed:.2f} ms" + (f"; {counters}" if on else "")
            variant = "optimized" if on else "reference"
            rows.append(Row(toggle, f"pipeline:{case_id}", variant, med, iqr, 0.0, note))
    return rows


def _print_table(rows: list[Row]) -> None:
    headers = ("optimization", "case", "variant", "median ms", "IQR ms", "peak MiB", "note")
    cells = [
        (
            r.optimization,
            r.case,
            r.variant,
            f"{r.median_ms:.3f}",
            f"{r.iqr_ms:.3f}",
            f"{r.peak_mib:.2f}",
            r.note,
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=31, help="repeats per op variant")
    parser.add_argument("--model-repeats", type=int, default=15, help="repeats per CFG step")
    parser.add_argument(
        "--prior-shape", type=int, nargs=3, default=(2, 4096, 2048), metavar=("B", "S", "D")
    )
    parser.add_argument("--qwen-preset", default="small", choices=("tiny", "small"))
    parser.add_argument("--qwen-grid", type=int, default=32, help="image patch grid side")
    parser.add_argument("--qwen-txt", type=int, default=128, help="text tokens")
    parser.add_argument("--varlen-txt", type=int, default=1024)
    parser.add_argument("--varlen-img", type=int, default=4096)
    parser.add_argument("--glm-latent", type=int, default=64, help="GLM latent side (syncs)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: keep)")
    parser.add_argument(
        "--pipeline-repeats", type=int, default=5, help="whole-pipeline calls per variant (d)"
    )
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(
        f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"repeats={args.repeats} model_repeats={args.model_repeats}"
    )
    rows = bench_prior_drop(args, device)
    rows += bench_modulation_cache(args, device)
    rows += bench_varlen_meta(args, device)
    rows += bench_pipeline(args, device)
    print()
    _print_table(rows)
    if device.type != "cuda":
        print(
            "\nCPU: there are no device->host syncs to save, so (c) shows host build cost only;"
            " run with a CUDA device for per-step sync counts."
        )
    if device.type == "cuda":
        print("\nDevice->host syncs per denoising step (cond + uncond), sync_debug_mode=warn:")
        for opt, variant, n in bench_syncs(args, device):
            print(f"  {opt:<24} {variant:<18} {n}")
    print(f"\n(total {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
