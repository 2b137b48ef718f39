"""A diffusers case's fields reach the `__call__` argument of their own name; `options`
pass the others, checked against the signature; what was passed is reported.

A tiny but complete `FluxPipeline` (CLIP and T5 text encoders with tokenizers built in
memory, a Flux DiT with guidance embeddings, an `AutoencoderKL`) is saved once per session
with `save_pretrained` and loaded offline; nothing is downloaded. Flux is the pipeline
family where guessing "the CFG argument" went wrong: its `guidance_scale` is a distilled
embedding (one denoiser pass per step) and `true_cfg_scale` is real CFG (two).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console

from perfguard.decision.tolerances import default_profiles
from perfguard.decision.verdict import judge
from perfguard.device.platform import probe
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import run_case
from perfguard.presentation.markdown import render_markdown
from perfguard.presentation.tables import cases_table
from perfguard.results import Results
from perfguard.storage import reports as rep
from perfguard.storage.baseline import Baseline
from perfguard.storage.cases import load_file, parse_case
from perfguard.storage.refresh import scenario_from_result
from tests.helpers import PG, diffusers_fields

STEPS = 2
README = Path(__file__).resolve().parent.parent / "README.md"


def _tiny_flux_pipeline(layers: int = 1):  # type: ignore[no-untyped-def]
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from tokenizers import pre_tokenizers
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTokenizer,
        T5Config,
        T5EncoderModel,
        T5TokenizerFast,
    )

    torch.manual_seed(0)
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    clip_tok = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    t5_tok = T5TokenizerFast(vocab=pieces + [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz▁"])
    clip = CLIPTextConfig(
        vocab_size=len(clip_tok) + 4,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        projection_dim=16,
        max_position_embeddings=77,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
    )
    t5 = T5Config(
        vocab_size=len(t5_tok) + 4, d_model=16, d_kv=8, d_ff=16, num_layers=1, num_heads=2
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D"] * 2,
            up_block_types=["UpDecoderBlock2D"] * 2,
            block_out_channels=[8, 8],
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=4,
            sample_size=32,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        ),
        text_encoder=CLIPTextModel(clip).eval(),
        tokenizer=clip_tok,
        text_encoder_2=T5EncoderModel(t5).eval(),
        tokenizer_2=t5_tok,
        transformer=FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=layers,
            num_single_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            joint_attention_dim=16,
            pooled_projection_dim=16,
            axes_dims_rope=[2, 2, 4],
            guidance_embeds=True,
        ),
    )


@pytest.fixture(scope="session")
def flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipelines") / "flux"
    _tiny_flux_pipeline().save_pretrained(path)
    return path


def _case(model: Path, **extra: object):  # type: ignore[no-untyped-def]
    fields = diffusers_fields("flux", model, STEPS, {"guidance_scale": 3.5, **extra})
    return parse_case(fields, "test.toml")


def _run(case):  # type: ignore[no-untyped-def]
    result = run_case(case, probe("cpu"), MeasureOptions(repeats=1, warmup=0))
    assert result.status == "ok", result.error
    return result


def test_guidance_scale_goes_to_fluxs_guidance_scale_not_to_true_cfg(flux: Path) -> None:
    result = _run(_case(flux))
    # One denoiser pass per step: Flux's distilled guidance, no true CFG (was 2 per step).
    assert result.counters == {"denoise_steps": [STEPS], "denoiser_calls": [STEPS]}
    args = result.arguments
    assert args is not None
    assert args["guidance_scale"] == 3.5 and "true_cfg_scale" not in args
    assert (args["prompt"], args["negative_prompt"]) == ("a red fox in the snow", "blurry")
    assert (args["height"], args["width"], args["num_inference_steps"]) == (32, 32, STEPS)
    assert args["output_type"] == "pt"
    assert args["generator"] == "torch.Generator('cpu').manual_seed(0)"


def test_options_pass_other_call_arguments_and_are_reported(flux: Path) -> None:
    case = _case(flux, options={"true_cfg_scale": 2.0, "max_sequence_length": 16})
    result = _run(case)
    # True CFG asked for explicitly: two denoiser passes per step.
    assert result.counters == {"denoise_steps": [STEPS], "denoiser_calls": [2 * STEPS]}
    assert result.arguments is not None
    assert (result.arguments["true_cfg_scale"], result.arguments["max_sequence_length"]) == (
        2.0,
        16,
    )
    baseline = Baseline(
        metadata={"platform": "cpu", "hardware": "test-cpu", "created": "t", "updated": "t"},
        profiles=default_profiles("cpu"),
        scenarios={"flux": scenario_from_result(result)},
    )
    report = rep.build(
        judge(Results(environment={}, settings={}, cases={"flux": result}), baseline),
        environment={"platform": "cpu", "hardware": "test-cpu"},
        baseline_info={"path": "b.json", "sha256": "0" * 64},
        profile=baseline.profile("pr_test").to_json(),
        settings={"source": "run", "inject": None},
        improvement_threshold=0.2,
    )
    md = render_markdown(report)
    assert "call arguments: " in md
    assert "max\\_sequence\\_length=16" in md and "true\\_cfg\\_scale=2.0" in md


def test_a_changed_pipeline_directory_is_named_against_the_baseline(
    flux: Path, tmp_path: Path
) -> None:
    before = _run(_case(flux))
    bigger = tmp_path / "flux2"
    _tiny_flux_pipeline(layers=2).save_pretrained(bigger)
    after = _run(_case(bigger))
    baseline = Baseline(
        metadata={"platform": "cpu", "hardware": "test-cpu", "created": "t", "updated": "t"},
        profiles=default_profiles("cpu"),
        scenarios={"flux": scenario_from_result(before)},
    )
    (case,) = judge(Results(environment={}, settings={}, cases={"flux": after}), baseline).cases
    (change,) = case.component_changes
    assert re.fullmatch(r"transformer parameters \d+ -> \d+", change), change
    old, new = (int(x) for x in re.findall(r"\d+", change))
    assert new > old


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _registry(tmp_path: Path, flux: Path, options: str) -> str:
    reg = tmp_path / "cases"
    reg.mkdir()
    (reg / "common.toml").write_text(
        f"""[[case]]
id = "flux"
workload = "diffusers"
model = "{flux}"
prompt = "a fox"
height = 32
width = 32
steps = 2
[case.options]
{options}
""",
        encoding="utf-8",
    )
    return str(reg)


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        (
            "max_seq_len = 16",
            ("options.max_seq_len", "FluxPipeline.__call__ takes no argument 'max_seq_len'"),
        ),
        ("num_inference_steps = 8", ("options.num_inference_steps", "field 'steps'")),
        ("output_type = 'pil'", ("options.output_type", "perfguard sets it")),
    ],
)
def test_an_option_the_signature_does_not_allow_stops_the_command_before_it_runs(
    flux: Path, tmp_path: Path, pg: PG, options: str, needles: tuple[str, ...]
) -> None:
    reg = _registry(tmp_path, flux, options)
    code, _, err = pg(
        "check", "--cases", reg, "--platform", "cpu", "--baseline", str(tmp_path / "b.json")
    )
    _one_line_error(code, err, "common.toml", "case 'flux'", *needles)
    assert not (tmp_path / "b.json").exists()


def test_an_option_value_toml_has_but_json_does_not_is_a_schema_error(
    flux: Path, tmp_path: Path, pg: PG
) -> None:
    reg = _registry(tmp_path, flux, "when = 1979-05-27")
    code, _, err = pg("list-cases", "--cases", reg, "--platform", "cpu")
    _one_line_error(code, err, "common.toml", "'flux'", "options.when")


def test_list_cases_shows_a_model_under_model_not_under_preset(flux: Path) -> None:
    built_in = parse_case({"id": "q", "workload": "qwen_image", "preset": "tiny"}, "common.toml")
    out = io.StringIO()
    Console(file=out, width=400, no_color=True).print(cases_table([built_in, _case(flux)], "cpu"))
    rows = {
        cells[0]: cells
        for line in out.getvalue().splitlines()
        if (cells := [c.strip() for c in line.strip("│┃ ").split("│")]) and len(cells) > 3
    }
    header = [c.strip() for c in out.getvalue().splitlines()[2].strip("┃ ").split("┃")]
    preset, model = header.index("preset"), header.index("model")
    assert (rows["q"][preset], rows["q"][model]) == ("tiny", "-")
    assert (rows["flux"][preset], rows["flux"][model]) == ("-", str(flux))


def test_the_readme_example_loads_from_a_file_of_any_name(tmp_path: Path) -> None:
    """Pasted into `my_team.toml` (not common.toml), the README's example must carry the
    `platforms` such a file needs."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Gate your own pipeline") :]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    path = tmp_path / "my_team.toml"
    path.write_text(block.group(1), encoding="utf-8")
    (case,) = load_file(path)
    assert case.workload == "diffusers"
    assert case.options  # the example shows how to pass other __call__ arguments
