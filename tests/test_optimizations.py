"""The three serving optimizations, their switches and their reference paths.

* ``qwen_modulation_cache``: per-block one-slot cache of ``img_mod``/``txt_mod`` outputs.
* ``qwen_varlen_host_meta``: varlen metadata from host lengths vs from the device mask.
* ``glm_prior_drop_inplace``: in-place prior-token drop vs ``masked_fill``.

Plus ``breakable_cuda_graph`` and ``build_model``.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from perfguard.workloads import qwen_image
from perfguard.workloads.attention import (
    VarlenMeta,
    build_varlen_mask_meta,
    build_varlen_mask_meta_from_ranges,
    dense_attention,
    joint_txt_img_ranges,
    varlen_attention,
)
from perfguard.workloads.glm_image import GlmImageTransformer2DModel, check_prior_token_drop
from perfguard.workloads.graphs import breakable_cuda_graph, is_in_breakable_cuda_graph
from perfguard.workloads.presets import build_model, get_preset, init_weights_
from perfguard.workloads.qwen_image import QwenImageTransformer2DModel

B, T, H, W = 2, 7, 4, 6


# ----------------------------------------------------------------------------------------
# Qwen fixtures
# ----------------------------------------------------------------------------------------


def _qwen(**overrides: object) -> QwenImageTransformer2DModel:
    config = {**get_preset("qwen_image", "tiny"), **overrides}
    return init_weights_(QwenImageTransformer2DModel(**config), seed=0, std=0.1).eval()


def _qwen_inputs(model: QwenImageTransformer2DModel, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    return dict(
        hidden_states=torch.randn(B, H * W, cfg.in_channels, generator=g),
        encoder_hidden_states=torch.randn(B, T, cfg.joint_attention_dim, generator=g),
        img_shapes=[[(1, H, W)]] * B,
    )


class _ModCounter:
    """Counts img_mod / txt_mod calls over all blocks via forward hooks."""

    def __init__(self, model: QwenImageTransformer2DModel) -> None:
        self.img = 0
        self.txt = 0
        for block in model.transformer_blocks:
            block.img_mod.register_forward_hook(self._hook("img"))
            block.txt_mod.register_forward_hook(self._hook("txt"))

    def _hook(self, which: str):
        def hook(module, args, output) -> None:
            setattr(self, which, getattr(self, which) + 1)

        return hook

    @property
    def counts(self) -> tuple[int, int]:
        return self.img, self.txt


def _slots(model: QwenImageTransformer2DModel) -> list:
    return [block._modulation_slot for block in model.transformer_blocks]


# ----------------------------------------------------------------------------------------
# qwen_modulation_cache
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_modulation_cache_uncond_pass_reuses_projections(mode: str) -> None:
    model = _qwen()
    n_layers = len(model.transformer_blocks)
    counter = _ModCounter(model)
    inputs = _qwen_inputs(model)
    neg = torch.randn_like(inputs["encoder_hidden_states"])
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with ctx:
        t = torch.full((B,), 0.5)  # an inference tensor under inference_mode
        model(**inputs, timestep=t)  # cond: miss, compute + store
        assert counter.counts == (n_layers, n_layers)
        assert all(s is not None for s in _slots(model))
        model(**{**inputs, "encoder_hidden_states": neg}, timestep=t)  # uncond: hit
        assert counter.counts == (n_layers, n_layers)
        assert all(s is None for s in _slots(model))  # consumed on the hit
        model(**inputs, timestep=t)  # next cond pass: slot empty -> compute again
        assert counter.counts == (2 * n_layers, 2 * n_layers)


def test_modulation_cache_inference_tensor_has_no_version() -> None:
    model = _qwen()
    with torch.inference_mode():
        t = torch.full((B,), 0.5)
        with pytest.raises(RuntimeError):
            _ = t._version  # why the key needs a guard
        key = model._modulation_key(t, None, torch.float32, torch.device("cpu"))
    assert key is not None and key.timestep is t and key.timestep_version is None


def _miss_after(change) -> None:
    model = _qwen(use_additional_t_cond=True)
    n_layers = len(model.transformer_blocks)
    counter = _ModCounter(model)
    inputs = _qwen_inputs(model)
    with torch.no_grad():
        t = torch.full((B,), 0.5)  # a normal tensor: has a version counter
        cond = torch.tensor([0, 1])
        model(**inputs, timestep=t, additional_t_cond=cond)
        t2, cond2 = change(t, cond)
        model(**inputs, timestep=t2, additional_t_cond=cond2)
    assert counter.counts == (2 * n_layers, 2 * n_layers)


def test_modulation_cache_misses_after_inplace_timestep_change() -> None:
    def bump(t, cond):
        t.add_(0)  # same object, same values, but `_version` moved on
        return t, cond

    _miss_after(bump)


def test_modulation_cache_misses_for_new_timestep_tensor() -> None:
    _miss_after(lambda t, cond: (t.clone(), cond))


def test_modulation_cache_misses_for_new_additional_t_cond() -> None:
    _miss_after(lambda t, cond: (t, cond.clone()))


def test_modulation_cache_misses_after_inplace_additional_t_cond_change() -> None:
    def bump(t, cond):
        cond.add_(0)
        return t, cond

    _miss_after(bump)


def test_modulation_cache_misses_after_weight_update() -> None:
    model = _qwen()
    counter = _ModCounter(model)
    inputs = _qwen_inputs(model)
    with torch.no_grad():
        t = torch.full((B,), 0.5)
        model(**inputs, timestep=t)
        model.transformer_blocks[0].img_mod[1].weight.mul_(1.0)  # e.g. a weight reload
        model(**inputs, timestep=t)
    # block 0 recomputes, the other blocks hit
    assert counter.counts == (len(model.transformer_blocks) + 1,) * 2


def test_modulation_cache_disabled_with_grad_clears_slot() -> None:
    model = _qwen()
    n_layers = len(model.transformer_blocks)
    counter = _ModCounter(model)
    inputs = _qwen_inputs(model)
    t = torch.full((B,), 0.5)
    with torch.no_grad():
        model(**inputs, timestep=t)
    assert all(s is not None for s in _slots(model))
    assert torch.is_grad_enabled()
    assert model._modulation_key(t, None, torch.float32, torch.device("cpu")) is None
    out = model(**inputs, timestep=t).sample  # same t, but grad on: no key, recompute
    assert out.requires_grad
    assert counter.counts == (2 * n_layers, 2 * n_layers)
    assert all(s is None for s in _slots(model))


def test_modulation_cache_disabled_in_breakable_graph_and_when_off() -> None:
    model = _qwen()
    t = torch.full((B,), 0.5)
    cpu = torch.device("cpu")
    with torch.no_grad():
        assert model._modulation_key(t, None, torch.float32, cpu) is not None
        with breakable_cuda_graph():
            assert model._modulation_key(t, None, torch.float32, cpu) is None
        model.qwen_modulation_cache = False
        assert model._modulation_key(t, None, torch.float32, cpu) is None
        counter = _ModCounter(model)
        inputs = _qwen_inputs(model)
        model(**inputs, timestep=t)
        model(**inputs, timestep=t)
    assert counter.counts == (4, 4)
    assert all(s is None for s in _slots(model))


def test_modulation_cache_key_holds_references() -> None:
    """The key keeps the timestep alive, so its id cannot be reused by a new tensor."""
    model = _qwen()
    inputs = _qwen_inputs(model)
    with torch.no_grad():
        t = torch.full((B,), 0.5)
        model(**inputs, timestep=t)
        t_id = id(t)
        del t
        slot = model.transformer_blocks[0]._modulation_slot
        assert id(slot.key.timestep) == t_id  # still alive, held by the slot


@pytest.mark.parametrize("masked", [False, True])
def test_modulation_cache_output_bit_exact(masked: bool) -> None:
    model = _qwen()
    inputs = _qwen_inputs(model)
    neg = torch.randn_like(inputs["encoder_hidden_states"])
    mask = torch.ones(B, T, dtype=torch.bool)
    if masked:
        mask[0, 3:] = False

    def cfg_pair() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            t = torch.full((B,), 0.37)
            cond = model(**inputs, timestep=t, encoder_hidden_states_mask=mask).sample
            uncond = model(
                **{**inputs, "encoder_hidden_states": neg},
                timestep=t,
                encoder_hidden_states_mask=mask,
            ).sample
        return cond, uncond

    model.qwen_modulation_cache = True
    on = cfg_pair()
    model.qwen_modulation_cache = False
    off = cfg_pair()
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


# ----------------------------------------------------------------------------------------
# qwen_varlen_host_meta: builders and packed attention
# ----------------------------------------------------------------------------------------


def _runs(row: torch.Tensor) -> list[tuple[int, int]]:
    """Contiguous True runs of a 1-D bool row as half-open ranges."""
    ranges, start = [], None
    for i, v in enumerate([*row.tolist(), False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            ranges.append((start, i))
            start = None
    return ranges


def _assert_meta_equal(a: VarlenMeta, b: VarlenMeta) -> None:
    assert a.cu_seqlens.dtype == b.cu_seqlens.dtype == torch.int32
    assert a.indices.dtype == b.indices.dtype == torch.int64
    assert a.inv_indices.dtype == b.inv_indices.dtype == torch.int32
    assert torch.equal(a.cu_seqlens, b.cu_seqlens)
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(a.inv_indices, b.inv_indices)
    assert a.max_seqlen == b.max_seqlen and isinstance(a.max_seqlen, int)
    assert a.seqlens == b.seqlens
    assert (a.batch_size, a.seq_len) == (b.batch_size, b.seq_len)


def test_varlen_builders_agree_on_random_masks() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        batch = 1 + trial % 4
        seq = 1 + int(torch.randint(0, 24, (1,), generator=g))
        mask = torch.rand(batch, seq, generator=g) < torch.rand(1, generator=g)
        mask[0] = False  # an all-padding row every time
        if batch > 1:
            mask[-1] = True  # and a fully valid one
        from_mask = build_varlen_mask_meta(mask)
        from_ranges = build_varlen_mask_meta_from_ranges(
            [_runs(row) for row in mask], seq_len=seq, device="cpu"
        )
        _assert_meta_equal(from_mask, from_ranges)
        # Semantics, not just agreement.
        flat = mask.reshape(-1)
        assert torch.equal(from_mask.indices, flat.nonzero().squeeze(1))
        assert from_mask.cu_seqlens[-1].item() == flat.sum().item()
        packed_pos = from_mask.inv_indices[from_mask.indices]
        assert torch.equal(packed_pos, torch.arange(len(from_mask.indices), dtype=torch.int32))
        assert (from_mask.inv_indices[~flat] == -1).all()


def test_varlen_builder_joint_ranges_and_single_range_rows() -> None:
    lens, txt_len, img_len = [3, 0, 7], 7, 5
    ranges = joint_txt_img_ranges(lens, txt_len, img_len)
    assert ranges[0] == [(0, 3), (7, 12)]
    mask = torch.zeros(3, txt_len + img_len, dtype=torch.bool)
    for b, n in enumerate(lens):
        mask[b, :n] = True
        mask[b, txt_len:] = True
    _assert_meta_equal(
        build_varlen_mask_meta(mask),
        build_varlen_mask_meta_from_ranges(ranges, txt_len + img_len, "cpu"),
    )
    # One (start, end) per row is accepted as well.
    _assert_meta_equal(
        build_varlen_mask_meta(torch.tensor([[True, True, False], [False, True, True]])),
        build_varlen_mask_meta_from_ranges([(0, 2), (1, 3)], 3, "cpu"),
    )


@pytest.mark.parametrize("bad", [[(2, 1)], [(0, 9)], [[(0, 3), (2, 5)]], [(-1, 2)]])
def test_varlen_ranges_are_validated(bad: list) -> None:
    with pytest.raises(ValueError, match="range"):
        build_varlen_mask_meta_from_ranges(bad, seq_len=8, device="cpu")


def test_packed_attention_equals_dense_masked_sdpa_on_valid_rows() -> None:
    g = torch.Generator().manual_seed(3)
    for trial in range(10):
        batch, seq, heads, dim = 3, 5 + trial, 2, 8
        q, k, v = (torch.randn(batch, seq, heads, dim, generator=g) for _ in range(3))
        mask = torch.rand(batch, seq, generator=g) < 0.6
        mask[:, -1] = True  # every row has at least one valid key (as Qwen's image tokens)
        if trial % 2:
            mask[0, :-1] = False
        meta = build_varlen_mask_meta(mask)
        packed = varlen_attention(q, k, v, meta)
        dense = dense_attention(q, k, v, attn_mask=mask[:, None, None, :])
        assert (packed[mask] - dense[mask]).abs().max().item() <= 1e-6
        assert (packed[~mask] == 0).all()  # padded query rows are zero


def test_varlen_attention_rejects_wrong_meta() -> None:
    meta = build_varlen_mask_meta(torch.ones(2, 4, dtype=torch.bool))
    q = torch.randn(2, 5, 1, 4)
    with pytest.raises(ValueError, match="VarlenMeta"):
        varlen_attention(q, q, q, meta)


class _BuilderSpy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("build_varlen_mask_meta", "build_varlen_mask_meta_from_ranges"):
            real = getattr(qwen_image, name)
            monkeypatch.setattr(qwen_image, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def wrapper(*args, **kwargs):
            self.calls.append(name)
            return real(*args, **kwargs)

        return wrapper


def _padded() -> tuple[torch.Tensor, list[int]]:
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    return mask, [7, 4]


def test_qwen_forward_uses_host_meta_for_txt_seq_lens(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _qwen()
    spy = _BuilderSpy(monkeypatch)
    inputs = _qwen_inputs(model)
    mask, lens = _padded()
    t = torch.full((B,), 0.5)
    with torch.no_grad():
        host = model(**inputs, timestep=t, encoder_hidden_states_mask=mask, txt_seq_lens=lens)
        assert spy.calls == ["build_varlen_mask_meta_from_ranges"]
        spy.calls.clear()
        device_path = model(**inputs, timestep=t, encoder_hidden_states_mask=mask)
        assert spy.calls == ["build_varlen_mask_meta"]
        spy.calls.clear()
        model.qwen_varlen_host_meta = False  # switch off: reference mask path
        off = model(**inputs, timestep=t, encoder_hidden_states_mask=mask, txt_seq_lens=lens)
        assert spy.calls == ["build_varlen_mask_meta"]
        spy.calls.clear()
        off_no_mask = model(**inputs, timestep=t, txt_seq_lens=lens)  # mask built from lens
        assert spy.calls == ["build_varlen_mask_meta"]
    assert torch.equal(host.sample, device_path.sample)
    assert torch.equal(host.sample, off.sample)
    assert torch.equal(host.sample, off_no_mask.sample)


def test_qwen_forward_mask_path_inside_breakable_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _qwen()
    spy = _BuilderSpy(monkeypatch)
    _, lens = _padded()
    with torch.no_grad(), breakable_cuda_graph():
        model(**_qwen_inputs(model), timestep=torch.full((B,), 0.5), txt_seq_lens=lens)
    assert spy.calls == ["build_varlen_mask_meta"]


@pytest.mark.parametrize("host_meta", [True, False], ids=["host_meta", "mask_meta"])
def test_qwen_forward_unpadded_lens_inside_breakable_graph_need_no_mask(
    monkeypatch: pytest.MonkeyPatch, host_meta: bool
) -> None:
    """Full-length host lengths mean dense attention even under capture, where the mask
    path's nonzero() could not be recorded (the pipeline passes `txt_seq_lens` always)."""
    model = _qwen()
    model.qwen_varlen_host_meta = host_meta
    spy = _BuilderSpy(monkeypatch)
    inputs = {**_qwen_inputs(model), "timestep": torch.full((B,), 0.5)}
    with torch.no_grad():
        eager = model(**inputs).sample
        with breakable_cuda_graph():
            graphed = model(**inputs, txt_seq_lens=[T, T]).sample
    assert spy.calls == []
    assert torch.equal(eager, graphed)


def test_qwen_forward_no_padding_is_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _qwen()
    spy = _BuilderSpy(monkeypatch)
    inputs = _qwen_inputs(model)
    t = torch.full((B,), 0.5)
    with torch.no_grad():
        ref = model(**inputs, timestep=t).sample
        full_lens = model(**inputs, timestep=t, txt_seq_lens=[T, T]).sample
        assert spy.calls == []  # no metadata at all: dense SDPA without a mask
        full_mask = model(
            **inputs, timestep=t, encoder_hidden_states_mask=torch.ones(B, T, dtype=torch.long)
        ).sample
    assert torch.equal(ref, full_lens) and torch.equal(ref, full_mask)


def test_qwen_invalid_txt_seq_lens_fall_back_to_the_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lengths that cannot be trusted are ignored, as diffusers ignores them: the mask
    builds the metadata when there is one, and without one attention is dense."""
    model = _qwen()
    inputs = {**_qwen_inputs(model), "timestep": torch.full((B,), 0.5)}
    mask, _ = _padded()
    spy = _BuilderSpy(monkeypatch)
    with torch.no_grad():
        dense = model(**inputs).sample
        masked = model(**inputs, encoder_hidden_states_mask=mask).sample
        spy.calls.clear()
        bad_values = ([7], [7, 8], [7, -1], [7.0, 4.0], [True, 4], torch.tensor([7.0, 4.0]), "74")
        for bad in bad_values:
            assert torch.equal(model(**inputs, txt_seq_lens=bad).sample, dense)
            with_mask = model(**inputs, encoder_hidden_states_mask=mask, txt_seq_lens=bad)
            assert torch.equal(with_mask.sample, masked)
    assert spy.calls == ["build_varlen_mask_meta"] * len(bad_values)


@pytest.mark.parametrize(
    "lens",
    [
        np.array([7, 4]),
        [np.int64(7), np.int32(4)],
        torch.tensor([7, 4]),
        torch.tensor([7, 4], dtype=torch.int32),
        [torch.tensor(7), torch.tensor(4)],
        (7, 4),
    ],
    ids=["numpy-array", "numpy-ints", "int64-tensor", "int32-tensor", "0d-tensors", "tuple"],
)
def test_qwen_integer_like_txt_seq_lens_take_the_host_path(
    monkeypatch: pytest.MonkeyPatch, lens: object
) -> None:
    model = _qwen()
    inputs = {**_qwen_inputs(model), "timestep": torch.full((B,), 0.5)}
    mask, host_lens = _padded()
    spy = _BuilderSpy(monkeypatch)
    with torch.no_grad():
        expected = model(**inputs, encoder_hidden_states_mask=mask, txt_seq_lens=host_lens)
        got = model(**inputs, encoder_hidden_states_mask=mask, txt_seq_lens=lens)
    assert spy.calls == ["build_varlen_mask_meta_from_ranges"] * 2
    assert torch.equal(got.sample, expected.sample)


# ----------------------------------------------------------------------------------------
# glm_prior_drop_inplace
# ----------------------------------------------------------------------------------------


def test_prior_token_drop_shape_contract() -> None:
    emb_shape = (2, 6, 4)
    ok = torch.zeros(2, 6, dtype=torch.bool)
    assert check_prior_token_drop(ok, emb_shape) is ok
    expanded = check_prior_token_drop(torch.tensor([[False], [True]]), emb_shape)
    assert expanded.shape == (2, 6) and expanded[1].all() and not expanded[0].any()
    for bad in (
        torch.zeros(2, 6, 1, dtype=torch.bool),
        torch.zeros(2, 5, dtype=torch.bool),
        torch.zeros(3, 6, dtype=torch.bool),
        torch.zeros(1, 6, dtype=torch.bool),
        torch.zeros(6, dtype=torch.bool),
    ):
        with pytest.raises(ValueError) as info:
            check_prior_token_drop(bad, emb_shape)
        assert str(tuple(bad.shape)) in str(info.value) and str(emb_shape) in str(info.value)
    with pytest.raises(ValueError, match="bool"):
        check_prior_token_drop(torch.zeros(2, 6, dtype=torch.long), emb_shape)


def _glm(**overrides: object) -> GlmImageTransformer2DModel:
    config = {**get_preset("glm_image", "tiny"), **overrides}
    return init_weights_(GlmImageTransformer2DModel(**config), seed=0, std=0.1).eval()


def _glm_inputs(model: GlmImageTransformer2DModel, drop: torch.Tensor | None = None) -> dict:
    g = torch.Generator().manual_seed(4)
    cfg = model.config
    seq = 4 * 6
    ids = torch.randint(0, cfg.prior_vq_quantizer_codebook_size, (B, seq), generator=g)
    if drop is None:
        drop = torch.rand(B, seq, generator=g) < 0.5
    return dict(
        hidden_states=torch.randn(B, cfg.in_channels, 8, 12, generator=g),
        encoder_hidden_states=torch.randn(B, 5, cfg.text_embed_dim, generator=g),
        prior_token_id=ids,
        prior_token_drop=drop,
        timestep=torch.tensor([999.0, 499.0]),
        target_size=torch.tensor([[64.0, 96.0]] * B),
        crop_coords=torch.zeros(B, 2),
    )


@pytest.mark.parametrize(
    "drop",
    [None, torch.tensor([[False], [True]]), torch.ones(B, 24, dtype=torch.bool)],
    ids=["random", "broadcast_B1", "all"],
)
def test_prior_drop_inplace_and_masked_fill_bit_identical(drop: torch.Tensor | None) -> None:
    model = _glm()
    inputs = _glm_inputs(model, drop)
    with torch.no_grad():
        model.glm_prior_drop_inplace = True
        inplace = model(**inputs).sample
        model.glm_prior_drop_inplace = False
        masked = model(**inputs).sample
    assert torch.equal(inplace, masked)


def _embedding_spy(model: GlmImageTransformer2DModel) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    model.prior_token_embedding.register_forward_hook(
        lambda module, args, out: seen.append(out) or None
    )
    return seen


def test_prior_drop_paths_mutate_or_not() -> None:
    model = _glm()
    inputs = _glm_inputs(model, torch.tensor([[False], [True]]))
    table = model.prior_token_embedding.weight
    pristine = F.embedding(inputs["prior_token_id"], table).detach()
    seen = _embedding_spy(model)
    with torch.no_grad():
        model(**inputs)  # optimized: the embedding output is zeroed in place
        assert torch.equal(seen[-1][0], pristine[0]) and (seen[-1][1] == 0).all()
        with breakable_cuda_graph():  # graph-safe masked_fill: output left untouched
            model(**inputs)
        assert torch.equal(seen[-1], pristine)
        model.glm_prior_drop_inplace = False  # reference: masked_fill
        model(**inputs)
        assert torch.equal(seen[-1], pristine)


def test_drop_prior_tokens_returns_same_or_new_tensor() -> None:
    model = _glm()
    emb = torch.randn(B, 3, 4)
    drop = torch.tensor([[True, False, True], [False, False, False]])
    with torch.no_grad():
        assert model.drop_prior_tokens(emb, drop) is emb
        with breakable_cuda_graph():
            assert model.drop_prior_tokens(emb, drop) is not emb
    with pytest.raises(ValueError, match=r"\(2, 3, 1\)"):
        model.drop_prior_tokens(emb, drop.unsqueeze(-1))


# ----------------------------------------------------------------------------------------
# breakable_cuda_graph
# ----------------------------------------------------------------------------------------


def test_breakable_cuda_graph_flag_nests_and_is_thread_local() -> None:
    assert not is_in_breakable_cuda_graph()
    seen_in_thread: list[bool] = []
    with breakable_cuda_graph():
        with breakable_cuda_graph():
            assert is_in_breakable_cuda_graph()
        assert is_in_breakable_cuda_graph()
        thread = threading.Thread(
            target=lambda: seen_in_thread.append(is_in_breakable_cuda_graph())
        )
        thread.start()
        thread.join()
    assert not is_in_breakable_cuda_graph()
    assert seen_in_thread == [False]
    with pytest.raises(KeyError), breakable_cuda_graph():
        raise KeyError("boom")
    assert not is_in_breakable_cuda_graph()


# ----------------------------------------------------------------------------------------
# presets / build_model
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["qwen_image", "glm_image"])
def test_build_model_deterministic_and_finite(workload: str) -> None:
    a = build_model(workload, "tiny", seed=7)
    b = build_model(workload, "tiny", seed=7)
    c = build_model(workload, "tiny", seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert all(torch.isfinite(v).all() for v in sa.values())
    assert not a.training
    inputs = (
        {**_qwen_inputs(a), "timestep": torch.full((B,), 0.5)}
        if workload == "qwen_image"
        else _glm_inputs(a)
    )
    with torch.no_grad():
        out = a(**inputs).sample
    assert torch.isfinite(out).all() and out.abs().max() > 0


def test_build_model_dtype_and_toggles() -> None:
    model = build_model(
        "qwen_image",
        "tiny",
        dtype=torch.bfloat16,
        toggles={"qwen_modulation_cache": False, "glm_prior_drop_inplace": False},
    )
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not model.qwen_modulation_cache and model.qwen_varlen_host_meta
    glm = build_model("glm_image", "small", toggles={"glm_prior_drop_inplace": False})
    assert not glm.glm_prior_drop_inplace
    assert glm.config.num_layers == 4


def test_build_model_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        build_model("flux", "tiny")
    with pytest.raises(ValueError, match="unknown preset"):
        build_model("qwen_image", "huge")
    with pytest.raises(ValueError, match="allow_full_on_cpu"):
        build_model("glm_image", "full")
    with pytest.raises(ValueError, match="unknown toggle"):
        build_model("qwen_image", "tiny", toggles={"turbo": True})


def test_full_presets_are_published_sizes() -> None:
    with torch.device("meta"):
        qwen = QwenImageTransformer2DModel(**get_preset("qwen_image", "full"))
        glm = GlmImageTransformer2DModel(**get_preset("glm_image", "full"))
    assert sum(p.numel() for p in qwen.parameters()) == 20_430_401_088
    assert qwen.inner_dim == 3072 and len(qwen.transformer_blocks) == 60
    assert len(glm.transformer_blocks) == 30 and glm.proj_out.in_features == 4096
