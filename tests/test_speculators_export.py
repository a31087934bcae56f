"""Export to speculators (hf_spec.hub.export), checked with the real ``speculators`` 0.9.0 package:
its config classes read every export, its ``Eagle3DraftModel`` loads the weights and computes the
same draft logits as our drafter (its own training-time-test forward, step by step), and the export
converts back to a bit-identical hf-spec drafter.

speculators pins heavy dependencies, so it is installed ``--no-deps`` into a private directory with
the few pure-Python packages its import needs (docs/hub.md, "Export to vLLM (speculators)"):

    pip install --no-deps --target .specpkgs speculators==0.9.0 hs-connectors==0.9.0 loguru==0.7.3 \
        "openai<3" httpx httpcore distro jiter
    PYTHONPATH=$PWD:$PWD/.specpkgs python -m pytest -q tests/test_speculators_export.py

Without it the tests that need it skip; the error tests run anyway.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_spec
from conftest import make_target, random_prompt
from hf_spec.hub import convert, export

LAYERS = 8


def _speculators():
    return pytest.importorskip("speculators", reason="speculators not installed (see this file's docstring)")


def _randomize(drafter, seed=0):
    """Random weights at a scale where every tensor matters (norms away from 1, a peaked head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if name.startswith("lm_head") else 0.08))
    return drafter


def target_and_drafter(tmp_path, family="llama", draft_size=48, norm_before_residual=False, seed=0):
    """(target saved at ``tmp_path/target`` = the verifier speculators loads, random Eagle3Drafter for it)."""
    target = make_target(family, num_hidden_layers=LAYERS, seed=seed)
    target_dir = tmp_path / "target"
    target.save_pretrained(target_dir)
    drafter = hf_spec.Eagle3Drafter.from_target(target, name_or_path=str(target_dir),
                                                norm_before_residual=norm_before_residual)  # fmt: skip
    if draft_size is not None:
        counts = torch.randint(0, 1000, (target.config.vocab_size,), generator=torch.Generator().manual_seed(seed))
        drafter.set_draft_vocab(counts, draft_size)
    return target, _randomize(drafter, seed).eval()


def fused_features(target, ids, layer_ids):
    with torch.no_grad():
        hidden = target.base_model(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in layer_ids], dim=-1)


def load_with_speculators(path):
    """speculators' own loading: ``SpeculatorModelConfig.from_pretrained`` then ``SpeculatorModel.from_pretrained``
    (which loads the embedding and verifier head from the verifier). Eager attention, so it runs on CPU."""
    speculators = _speculators()
    config = speculators.SpeculatorModelConfig.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = "eager"
    model = speculators.SpeculatorModel.from_pretrained(path, config=config)
    # speculators 0.9 pins transformers <= 5.19; under the 5.23 hf-spec pins, from_pretrained builds the model on
    # the meta device, so embed_tokens (absent from the checkpoint) comes back uninitialized instead of carrying
    # the NaN marker that makes load_verifier_weights fill it. Restore the marker and run speculators' own loading.
    with torch.no_grad():
        model.embed_tokens.weight.fill_(float("nan"))
    model.load_verifier_weights()
    return config, model.float().eval()


def speculators_step_logits(model, fused, ids, steps):
    """The draft logits of each training-time-test step of speculators' Eagle3DraftModel.forward."""
    logits = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: logits.append(out.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=fused, input_ids=ids, document_ids=torch.zeros_like(ids),
                  position_ids=torch.arange(ids.shape[1]).view(1, -1), ttt_steps=steps)  # fmt: skip
    finally:
        hook.remove()
    return logits


CASES = [("llama", 48, False), ("qwen2", None, True), ("llama", None, False)]


@pytest.mark.parametrize("family,draft_size,norm_before_residual", CASES,
                         ids=[f"{f}-D{d or 'V'}-nbr{int(n)}" for f, d, n in CASES])  # fmt: skip
def test_eagle3_export_loads_in_speculators_and_computes_our_logits(tmp_path, family, draft_size, norm_before_residual):
    speculators = _speculators()
    target, drafter = target_and_drafter(tmp_path, family, draft_size, norm_before_residual)
    mapping = export.export_speculators(drafter, tmp_path / "spec")
    assert all(k == v for k, v in mapping.items())

    config, model = load_with_speculators(tmp_path / "spec")
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    assert type(config) is Eagle3SpeculatorConfig and type(model) is Eagle3DraftModel
    assert config.speculators_model_type == "eagle3"
    assert config.draft_vocab_size == (draft_size or target.config.vocab_size)
    assert config.norm_before_residual is norm_before_residual
    assert config.eagle_aux_hidden_state_layer_ids == [2, 4, 5] == drafter.config.eagle_aux_hidden_state_layer_ids
    assert not (config.norm_before_fc or config.fc_norm or config.norm_output)
    layer = config.transformer_layer_config
    assert (layer.model_type, layer.hidden_size, layer.vocab_size, layer.num_hidden_layers) == ("llama", 64, 128, 1)
    assert (layer.head_dim, layer.num_key_value_heads, layer.rms_norm_eps) == (16, 2, target.config.rms_norm_eps)
    assert not layer.attention_bias and not layer.mlp_bias
    block = config.speculators_config
    assert block.algorithm == "eagle3" and block.default_proposal_method == "greedy"
    assert block.verifier.name_or_path == str(tmp_path / "target")
    assert block.verifier.architectures == [type(target).__name__]
    assert block.proposal_methods[0].speculative_tokens == drafter.config.tree_depth
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["norm_before_residual"] is norm_before_residual

    # every tensor lands in speculators' model unchanged; embedding and verifier head come from the target
    theirs = model.state_dict()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(theirs[name], tensor), name
    assert torch.equal(model.embed_tokens.weight, target.get_input_embeddings().weight)
    head = target.get_output_embeddings().weight
    assert torch.equal(model.verifier_lm_head.weight, head if draft_size is None else head[drafter.t2d])
    assert (model.d2t is None) == (draft_size is None)
    torch.testing.assert_close(model.rotary_emb.inv_freq, drafter.rotary_emb.inv_freq, rtol=0, atol=0)

    # speculators' forward: step 1 = our drafter over the fused target layers; step 2 = our drafter fed
    # its own pre-norm hidden state (no fc) and the next token, as at tree depth 2
    ids = random_prompt(12, seed=4)
    fused = fused_features(target, ids, [2, 4, 5])
    first, second = speculators_step_logits(model, fused[:, :-1], ids[:, 1:], steps=2)
    with torch.no_grad():
        ours = drafter(input_ids=ids[:, 1:], hidden_states=fused[:, :-1], output_logits=True)
        torch.testing.assert_close(first, ours.logits, rtol=1e-5, atol=1e-5)
        # anchor a at depth 2: a's context (positions <= a) then (its own hidden, token a + 2) at position a + 1
        for a in (0, 5, 9):
            context = drafter(input_ids=ids[:, 1 : a + 2], hidden_states=fused[:, : a + 1], use_cache=True,
                              past_key_values=(cache := _cache()))  # fmt: skip
            depth2 = drafter(input_ids=ids[:, a + 2 : a + 3], hidden_states=context.last_hidden_state[:, -1:],
                             position_ids=torch.tensor([[a + 1]]), past_key_values=cache, output_logits=True)  # fmt: skip
            torch.testing.assert_close(second[:, a], depth2.logits[:, 0], rtol=1e-5, atol=1e-5)


def _cache():
    from hf_spec import compat

    return compat.full_dynamic_cache()


@pytest.mark.parametrize("draft_size", [48, None])
def test_round_trip_through_speculators_is_bit_identical(tmp_path, draft_size):
    target, drafter = target_and_drafter(tmp_path, "llama", draft_size, norm_before_residual=True)
    export.export_speculators(drafter, tmp_path / "spec")
    assert convert.detect_layout(tmp_path / "spec") == convert.SPECULATORS_EAGLE3
    back = hf_spec.AutoDrafter.from_pretrained(tmp_path / "spec", target=target)
    assert type(back) is hf_spec.Eagle3Drafter
    a, b = drafter.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    for field in ("eagle_aux_hidden_state_layer_ids", "norm_before_residual", "fc_bias", "draft_vocab_size",
                  "target_hidden_size", "target_vocab_size"):  # fmt: skip
        assert getattr(back.config, field) == getattr(drafter.config, field), field
    prompt = random_prompt(seed=7)
    expected = target.generate(prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=back, max_new_tokens=16, do_sample=False), expected)
    # and out again: the same files (the saved hf-spec directory exports without the drafter class)
    back.save_pretrained(tmp_path / "ours")
    export.export_speculators(tmp_path / "ours", tmp_path / "spec2", verifier_name_or_path=str(tmp_path / "target"))
    first, second = load_file(tmp_path / "spec" / "model.safetensors"), load_file(tmp_path / "spec2" / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    config1 = json.loads((tmp_path / "spec" / "config.json").read_text())
    config2 = json.loads((tmp_path / "spec2" / "config.json").read_text())
    config1["speculators_config"]["proposal_methods"] = config2["speculators_config"]["proposal_methods"] = None
    assert config1 == config2


def test_parallelspec_does_not_export_and_peagle_shows_why(tmp_path):
    drafter = hf_spec.ParallelDrafter.from_target(make_target())
    with pytest.raises(ValueError, match=r"ParallelSpec drafters do not export.*peagle.*one \[MASK\] embedding per depth"):
        export.export_speculators(drafter, tmp_path / "p")
    assert not (tmp_path / "p").exists()
    # what the message says about P-EAGLE, from speculators itself: EAGLE-3's tensors plus ONE mask hidden state
    speculators = _speculators()
    target, eagle3 = target_and_drafter(tmp_path, "llama", None)
    export.export_speculators(eagle3, tmp_path / "e3")
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    config3 = speculators.SpeculatorModelConfig.from_dict(config)
    configp = speculators.SpeculatorModelConfig.from_dict({**config, "speculators_model_type": "peagle", "mask_token_id": 1})
    for c in (config3, configp):
        c.transformer_layer_config._attn_implementation = "eager"
    names3 = {k: v.shape for k, v in speculators.SpeculatorModel.registry["eagle3"](config3).state_dict().items()}
    namesp = {k: v.shape for k, v in speculators.SpeculatorModel.registry["peagle"](configp).state_dict().items()}
    assert set(namesp) - set(names3) == {"mask_hidden"} and namesp["mask_hidden"] == (1, 1, 3 * 64)
    assert names3["fc.weight"] == (64, 3 * 64) and "layers.0.hidden_norm.weight" in names3 and "norm.weight" in names3


def test_eagle_drafters_raise_unless_legacy_and_speculators_rejects_legacy(tmp_path):
    drafter = hf_spec.EagleDrafter.from_target(make_target(), name_or_path="org/tiny")
    with pytest.raises(ValueError, match=r"speculators 0\.1-0\.4 only.*train_eagle3\.py.*legacy_eagle=True"):
        export.export_speculators(drafter, tmp_path / "e")
    mapping = export.export_speculators(drafter, tmp_path / "legacy", legacy_eagle=True)
    assert set(mapping.values()) == set(load_file(tmp_path / "legacy" / "model.safetensors"))
    speculators = _speculators()
    with pytest.raises(Exception, match=r"'eagle'.*eagle3"):  # what speculators 0.9 says of the old layout
        speculators.SpeculatorModelConfig.from_pretrained(tmp_path / "legacy")


def test_fc_bias_and_other_families_name_the_fix(tmp_path):
    target = make_target(num_hidden_layers=LAYERS)
    with pytest.raises(ValueError, match="fc has a bias"):
        export.export_speculators(hf_spec.Eagle3Drafter.from_target(target, fc_bias=True), tmp_path / "b")
    saved = tmp_path / "sorted"  # a saved S2D drafter, as export reads it (config.json + model.safetensors)
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps({"model_type": "hf_spec_sorted"}))
    save_file({"exits.0.weight": torch.zeros(2, 2)}, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match="no speculators counterpart.*train_eagle3"):
        export.export_speculators(saved, tmp_path / "s")


def test_export_looks_families_up_in_one_table(tmp_path):
    """EXPORTERS and NOT_EXPORTABLE name registered families; any other registered type raises a ValueError naming
    the exportable types (model_type, class, speculators type) before reading its weights' layout."""
    assert set(export.EXPORTERS) == {"hf_spec_eagle3", "hf_spec_eagle"}
    assert set(export.EXPORTERS) | set(export.NOT_EXPORTABLE) <= set(hf_spec.DRAFTER_CLASSES)
    assert not set(export.EXPORTERS) & set(export.NOT_EXPORTABLE)
    others = sorted(set(hf_spec.DRAFTER_CLASSES) - set(export.EXPORTERS) - set(export.NOT_EXPORTABLE))
    assert others == ["hf_spec_ngram", "hf_spec_sorted"]
    for model_type in others + ["not_a_drafter"]:
        saved = tmp_path / model_type
        saved.mkdir()
        (saved / "config.json").write_text(json.dumps({"model_type": model_type}))
        save_file({"w": torch.zeros(1)}, str(saved / "model.safetensors"))
        with pytest.raises(ValueError) as err:
            export.export_speculators(saved, tmp_path / "out")
        message = str(err.value)
        assert f"{model_type!r} drafters have no speculators counterpart" in message
        assert "hf_spec_eagle3 (Eagle3Drafter, as eagle3)" in message and "hf_spec_eagle (EagleDrafter, as eagle" in message
    assert not (tmp_path / "out").exists()


def test_cli_export(tmp_path):
    from hf_spec.cli import main

    target, drafter = target_and_drafter(tmp_path, "llama", 48)
    drafter.save_pretrained(tmp_path / "saved")
    assert main(["export", str(tmp_path / "saved"), str(tmp_path / "spec"), "--speculative-tokens", "3"]) == 0
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 48
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    back = hf_spec.AutoDrafter.from_pretrained(tmp_path / "spec", target=target)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in drafter.state_dict().items())
    hf_spec.EagleDrafter.from_target(target).save_pretrained(tmp_path / "eagle")
    with pytest.raises(SystemExit, match="legacy_eagle=True"):
        main(["export", str(tmp_path / "eagle"), str(tmp_path / "x")])
    assert main(["export", str(tmp_path / "eagle"), str(tmp_path / "x"), "--legacy-eagle"]) == 0


def test_a_packaged_target_name_is_flagged(tmp_path):
    drafter = hf_spec.Eagle3Drafter.from_target(make_target(num_hidden_layers=LAYERS), name_or_path="smollm2-135m-instruct")
    with pytest.warns(UserWarning, match="packaged model name.*verifier_name_or_path"):
        export.export_speculators(drafter, tmp_path / "a")
    export.export_speculators(drafter, tmp_path / "b", verifier_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
