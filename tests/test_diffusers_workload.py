"""`workload = "diffusers"`: a saved diffusers pipeline, timed through its public seams.

A tiny but complete `QwenImagePipeline` (Qwen2.5-VL text encoder, Qwen-Image DiT,
`AutoencoderKLQwenImage`, flow-matching scheduler, a byte-level `Qwen2Tokenizer` built in
memory) is saved once per session with `save_pretrained` and driven through `run`,
`gen-baselines`, `check` and `list-cases`; nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from perfguard.device.platform import probe
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import run_case
from perfguard.storage.cases import parse_case
from tests.helpers import PG, diffusers_fields

STEPS = 2


def _byte_level_tokenizer():  # type: ignore[no-untyped-def]
    """A `Qwen2Tokenizer` over the 256 byte-level symbols plus Qwen's chat markers."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


def _tiny_qwen_image_pipeline():  # type: ignore[no-untyped-def]
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    tok = _byte_level_tokenizer()
    vocab = len(tok) + 8
    text = dict(
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
        vocab_size=vocab,
    )
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16)
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, hidden_size=16, vocab_size=vocab
    )
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=AutoencoderKLQwenImage(
            base_dim=4,
            z_dim=4,
            dim_mult=[1, 2, 4],
            num_res_blocks=1,
            temperal_downsample=[False, True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        ),
        text_encoder=Qwen2_5_VLForConditionalGeneration(config).eval(),
        tokenizer=tok,
        transformer=QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=16,
            axes_dims_rope=(4, 6, 6),
        ),
    )


def _tiny_ddpm_pipeline():  # type: ignore[no-untyped-def]
    """A pipeline that takes no prompt: a diffusers case cannot drive it."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    unet = UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 8),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )
    return DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10))


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipelines")
    out = {"qwen": root / "qwen", "ddpm": root / "ddpm"}
    _tiny_qwen_image_pipeline().save_pretrained(out["qwen"])
    _tiny_ddpm_pipeline().save_pretrained(out["ddpm"])
    return out


def _case_toml(case_id: str, model: Path, **extra: object) -> str:
    fields = diffusers_fields(
        case_id, model, STEPS, {"dtype": "float32", "seed": 0, "tags": ["smoke"], **extra}
    )
    lines = ["[[case]]"]
    for key, value in fields.items():
        if isinstance(value, dict):
            continue
        lines.append(f"{key} = {json.dumps(value)}")
    for key, value in fields.items():
        if isinstance(value, dict):
            lines.append(f"[case.{key}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def _registry(tmp_path: Path, *tables: str) -> str:
    reg = tmp_path / "cases"
    reg.mkdir(exist_ok=True)
    (reg / "common.toml").write_text("\n".join(tables), encoding="utf-8")
    return str(reg)


def _case(model: Path, **extra: object):  # type: ignore[no-untyped-def]
    return parse_case(diffusers_fields("mine", model, STEPS, extra), "test.toml")


# ---- measuring --------------------------------------------------------------------------


def test_stages_steps_components_and_counters_come_from_the_pipelines_own_seams(
    models: dict[str, Path],
) -> None:
    result = run_case(_case(models["qwen"]), probe("cpu"), MeasureOptions(repeats=2, warmup=1))
    assert result.status == "ok", result.error
    s = result.samples
    stages = ("stage:TextEncodingStage", "stage:DenoisingStage", "stage:DecodingStage")
    assert sorted(k for k in s if k.startswith("stage:")) == sorted(stages)  # none nested
    for name in stages:
        assert all(v > 0 for v in s[name]), name
    assert sorted(k for k in s if k.startswith("step:")) == [f"step:{i}" for i in range(STEPS)]
    for run in range(2):
        steps = sum(s[f"step:{i}"][run] for i in range(STEPS))
        assert steps <= s["stage:DenoisingStage"][run] <= s["e2e"][run]
        staged = sum(s[k][run] for k in s if k.startswith("stage:"))
        assert staged <= s["e2e"][run]
    assert result.deterministic is True
    comps = result.components
    assert comps is not None
    assert comps["transformer"]["class"] == (
        "diffusers.models.transformers.transformer_qwenimage.QwenImageTransformer2DModel"
    )
    assert comps["text_encoder"]["class"].endswith("Qwen2_5_VLForConditionalGeneration")
    assert comps["vae"]["class"].endswith("AutoencoderKLQwenImage")
    assert all(comps[r]["parameters"] > 0 for r in ("text_encoder", "transformer", "vae"))
    # Parts without parameters count 0, as in the built-in pipelines (not "unknown").
    assert comps["scheduler"] == {
        "class": "diffusers.schedulers.scheduling_flow_match_euler_discrete."
        "FlowMatchEulerDiscreteScheduler",
        "parameters": 0,
    }
    assert comps["tokenizer"]["class"].endswith("Qwen2Tokenizer")
    assert comps["tokenizer"]["parameters"] == 0
    # True CFG (a negative prompt and true_cfg_scale > 1): two transformer calls per step.
    assert result.counters == {"denoise_steps": [STEPS, STEPS], "denoiser_calls": [4, 4]}


def test_without_a_negative_prompt_qwen_image_runs_one_pass_per_step(
    models: dict[str, Path],
) -> None:
    case = parse_case(
        {
            "id": "nocfg",
            "workload": "diffusers",
            "model": str(models["qwen"]),
            "prompt": "a fox",
            "height": 32,
            "width": 32,
            "steps": STEPS,
        },
        "test.toml",
    )
    result = run_case(case, probe("cpu"), MeasureOptions(repeats=1, warmup=0))
    assert result.status == "ok", result.error
    assert result.counters == {"denoise_steps": [STEPS], "denoiser_calls": [STEPS]}


def test_perfguards_dit_swapped_in_gives_the_diffusers_image(models: dict[str, Path]) -> None:
    from perfguard.interop.diffusers import build_diffusers_pipeline

    platform = probe("cpu")
    theirs = build_diffusers_pipeline(_case(models["qwen"]), platform)
    ours = build_diffusers_pipeline(_case(models["qwen"], dit="perfguard"), platform)
    assert type(ours.pipe.transformer).__module__ == "perfguard.workloads.qwen_image"
    assert type(theirs.pipe.transformer).__module__.startswith("diffusers.")
    a, b = theirs(), ours()
    assert a.shape == (1, 3, 32, 32)
    torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_toggles_reach_the_swapped_dit(models: dict[str, Path]) -> None:
    from perfguard.interop.diffusers import build_diffusers_pipeline

    case = _case(models["qwen"], dit="perfguard", toggles={"qwen_modulation_cache": False})
    pipe = build_diffusers_pipeline(case, probe("cpu"))
    assert pipe.pipe.transformer.qwen_modulation_cache is False
    assert pipe.pipe.transformer.qwen_varlen_host_meta is True


# ---- the commands -----------------------------------------------------------------------


def test_run_gen_baselines_and_check_end_to_end(
    models: dict[str, Path], tmp_path: Path, pg: PG, no_contention_wait: None
) -> None:
    reg = _registry(tmp_path, _case_toml("my_qwen", models["qwen"]))
    base, results = str(tmp_path / "b.json"), str(tmp_path / "r.json")
    measure = ("--cases", reg, "--platform", "cpu", "--repeats", "3", "--warmup", "1")
    code, _, err = pg("run", *measure, "--out", results)
    assert code == 0, err
    data = json.loads(Path(results).read_text())["cases"]["my_qwen"]
    assert "stage:DecodingStage" in data["samples"]
    assert data["components"]["transformer"]["parameters"] > 0
    assert data["counters"]["denoise_steps"] == [STEPS] * 3

    code, _, err = pg("gen-baselines", *measure, "--baseline", base)
    assert code == 0, err
    report, md = str(tmp_path / "rep.json"), str(tmp_path / "rep.md")
    # One pass, no adaptive sampling or re-runs: the verdict's content is not the point here.
    once = ("--max-repeats", "3", "--max-reruns", "0")
    code, _, err = pg(
        "check", *measure, *once, "--baseline", base, "--report", report, "--markdown", md
    )
    # A verdict, or none on a runner that a shared CPU made slower the second time (exit 4):
    # the flow and what the report records are the point here.
    assert code in (0, 1, 4), err
    rep = json.loads(Path(report).read_text())["cases"]["my_qwen"]
    assert rep["components"]["vae"]["class"].endswith("AutoencoderKLQwenImage")
    assert rep["counters"]["denoiser_calls"][0] == 4
    text = Path(md).read_text()
    assert "components: " in text and "QwenImageTransformer2DModel" in text
    assert "counters per run: denoise\\_steps 2" in text
    assert "call arguments: " in text and "num\\_inference\\_steps=2" in text


def test_list_cases_json_names_the_components(
    models: dict[str, Path], tmp_path: Path, pg: PG
) -> None:
    reg = _registry(tmp_path, _case_toml("my_qwen", models["qwen"]))
    code, out, err = pg("list-cases", "--cases", reg, "--platform", "cpu", "--json")
    assert code == 0, err
    (entry,) = json.loads(out)
    assert entry["components"]["transformer"] == {
        "class": "diffusers.QwenImageTransformer2DModel",
        "parameters": None,
    }
    assert entry["components_note"] == "parameter counts known after a run"


def test_list_cases_json_lists_a_built_in_cases_dit_with_its_parameters(pg: PG) -> None:
    code, out, err = pg(
        "list-cases", "--platform", "cpu", "--json", "--case", "qwen_image_t2i_smoke"
    )
    assert code == 0, err
    (entry,) = json.loads(out)
    dit = entry["components"]["transformer"]
    assert dit["class"] == "perfguard.workloads.qwen_image.QwenImageTransformer2DModel"
    assert dit["parameters"] > 0


# ---- bad input --------------------------------------------------------------------------


def _one_line_error(code: int, err: str, expected_code: int, *needles: str) -> None:
    assert code == expected_code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err


def test_a_model_directory_that_does_not_exist_is_a_data_error(tmp_path: Path, pg: PG) -> None:
    missing = tmp_path / "nowhere"
    reg = _registry(tmp_path, _case_toml("gone", missing))
    code, _, err = pg("run", "--cases", reg, "--platform", "cpu", "--repeats", "1")
    _one_line_error(code, err, 2, "'gone'", str(missing), "no such directory")


def test_a_directory_that_is_not_a_pipeline_is_a_data_error(tmp_path: Path, pg: PG) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    reg = _registry(tmp_path, _case_toml("plain", plain))
    code, _, err = pg(
        "gen-baselines", "--cases", reg, "--platform", "cpu", "--baseline", str(tmp_path / "b.json")
    )
    _one_line_error(code, err, 2, "'plain'", str(plain), "model_index.json")
    assert not (tmp_path / "b.json").exists()


def test_a_pipeline_missing_weights_would_need_a_download(
    models: dict[str, Path], tmp_path: Path, pg: PG
) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(models["qwen"], partial)
    for f in (partial / "vae").glob("*.safetensors"):
        f.unlink()
    reg = _registry(tmp_path, _case_toml("partial", partial))
    code, _, err = pg(
        "check", "--cases", reg, "--platform", "cpu", "--baseline", str(tmp_path / "b.json")
    )
    _one_line_error(code, err, 2, "'partial'", "'vae'", "needs a download")


def test_a_pipeline_that_does_not_take_the_cases_arguments_fails_that_case_only(
    models: dict[str, Path], tmp_path: Path, pg: PG
) -> None:
    reg = _registry(
        tmp_path,
        _case_toml("ddpm", models["ddpm"], steps=1),
        _case_toml("qwen", models["qwen"]),
    )
    out_path = tmp_path / "r.json"
    code, _out, err = pg(
        "run",
        "--cases",
        reg,
        "--platform",
        "cpu",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        str(out_path),
    )
    assert code == 3, err
    cases = json.loads(out_path.read_text())["cases"]
    assert cases["qwen"]["status"] == "ok"
    assert cases["ddpm"]["status"] == "error"
    assert "DDPMPipeline.__call__ does not take prompt" in cases["ddpm"]["error"]


@pytest.mark.parametrize(
    ("extra", "field", "why"),
    [
        ({"preset": "tiny"}, "preset", "does not apply to a 'diffusers' case"),
        ({"batch": 2}, "batch", "does not apply to a 'diffusers' case"),
        ({"toggles": {"qwen_modulation_cache": False}}, "toggles", "does not apply"),
        ({"num_devices": 2}, "num_devices", "does not apply"),
    ],
)
def test_fields_that_do_not_apply_to_a_diffusers_case_are_schema_errors(
    models: dict[str, Path], tmp_path: Path, pg: PG, extra: dict, field: str, why: str
) -> None:
    reg = _registry(tmp_path, _case_toml("bad", models["qwen"], **extra))
    code, _, err = pg("list-cases", "--cases", reg, "--platform", "cpu")
    _one_line_error(code, err, 2, "common.toml", "'bad'", f"{field}: {why}")


def test_a_toggle_of_another_workload_on_a_swapped_dit_is_a_data_error(
    models: dict[str, Path], tmp_path: Path, pg: PG
) -> None:
    reg = _registry(
        tmp_path,
        _case_toml(
            "glm_toggle", models["qwen"], dit="perfguard", toggles={"glm_prior_drop_inplace": False}
        ),
    )
    code, _, err = pg("run", "--cases", reg, "--platform", "cpu", "--repeats", "1")
    _one_line_error(
        code, err, 2, "'glm_toggle'", "toggles.glm_prior_drop_inplace", "QwenImagePipeline"
    )


def test_dit_perfguard_needs_a_pipeline_perfguard_has_a_dit_for(
    models: dict[str, Path], tmp_path: Path, pg: PG
) -> None:
    reg = _registry(tmp_path, _case_toml("ddpm", models["ddpm"], dit="perfguard"))
    code, _, err = pg("run", "--cases", reg, "--platform", "cpu", "--repeats", "1")
    _one_line_error(code, err, 2, "'ddpm'", "dit:", "DDPMPipeline")


def test_a_glm_image_pipelines_transformer_swaps_for_perfguards_with_its_weights() -> None:
    import diffusers

    from perfguard.interop.diffusers import swap_dit
    from perfguard.workloads.presets import get_preset
    from tests.helpers import glm_dit_inputs

    GLM_TINY = get_preset("glm_image", "tiny")

    class GlmImagePipeline:  # what swap_dit needs of the pipeline: its class name, .transformer
        transformer = diffusers.GlmImageTransformer2DModel(**GLM_TINY).eval()

    pipe = GlmImagePipeline()
    theirs = pipe.transformer
    case = _case(Path("unused"), dit="perfguard", toggles={"glm_prior_drop_inplace": False})
    ours = swap_dit(pipe, case)
    assert pipe.transformer is ours and ours.glm_prior_drop_inplace is False
    assert type(ours).__module__ == "perfguard.workloads.glm_image"
    inputs = glm_dit_inputs(GLM_TINY)
    with torch.no_grad(), ours.cache_context("cond"):
        torch.testing.assert_close(
            ours(**inputs, return_dict=False)[0],
            theirs(**inputs, return_dict=False)[0],
            rtol=0,
            atol=1e-5,
        )


def test_an_isolated_run_keeps_components_and_counters(
    models: dict[str, Path], tmp_path: Path, pg: PG
) -> None:
    reg = _registry(tmp_path, _case_toml("iso", models["qwen"]))
    out = tmp_path / "r.json"
    code, _, err = pg(
        "run",
        "--cases",
        reg,
        "--platform",
        "cpu",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--isolate",
        "--out",
        str(out),
    )
    assert code == 0, err
    case = json.loads(out.read_text())["cases"]["iso"]
    assert case["components"]["text_encoder"]["parameters"] > 0
    assert case["counters"] == {"denoise_steps": [STEPS] * 2, "denoiser_calls": [4, 4]}


def test_ab_toggles_on_a_pipelines_own_transformer_are_refused(models: dict[str, Path]) -> None:
    from perfguard.errors import PerfguardError

    with pytest.raises(PerfguardError, match=r'toggles: .*dit = "perfguard"'):
        _case(models["qwen"]).with_toggles(qwen_modulation_cache=False)
    swapped = _case(models["qwen"], dit="perfguard").with_toggles(qwen_modulation_cache=False)
    assert swapped.toggles == {"qwen_modulation_cache": False}
