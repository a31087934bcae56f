"""hf_spec.hardware: the dtype that pays on the machine at hand, MKL's code path, the emulated-bf16 warning."""

import warnings

import pytest
import torch

import hf_spec
from hf_spec import hardware
from hf_spec.cli import build_parser
from conftest import make_target, random_prompt


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given /proc/cpuinfo flags and vendor."""

    def pretend(flags, vendor="AuthenticAMD"):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: None if flags is None else frozenset(flags))
        monkeypatch.setattr(hardware, "cpu_vendor", lambda: vendor)

    return pretend


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"avx2", "fma"}, torch.float32),  # AMD Zen 3 / older Xeons: bf16 emulated
        ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),  # Zen 4, Cooper Lake and later
        ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, torch.bfloat16),  # Sapphire Rapids
        ({"fp", "asimd", "bf16"}, torch.bfloat16),  # Arm with BF16 (Features line)
    ],
)
def test_auto_dtype_is_bf16_only_where_the_cpu_computes_it(cpu, flags, expected):
    cpu(flags)
    assert hardware.resolve_dtype("auto") == expected
    assert hardware.native_bf16("cpu") == (expected == torch.bfloat16)


def test_named_dtypes_pass_through_and_unknown_names_say_the_fix(cpu):
    cpu({"avx2"})
    assert hardware.resolve_dtype("bfloat16") == torch.bfloat16  # the user's explicit choice wins
    assert hardware.resolve_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="Unknown dtype 'fp8'.*'auto'"):
        hardware.resolve_dtype("fp8")


def test_unreadable_cpu_flags_count_as_not_native_off_apple_silicon(cpu, monkeypatch):
    cpu(None)
    monkeypatch.setattr(hardware.platform, "system", lambda: "Windows")
    assert hardware.resolve_dtype("auto") == torch.float32
    monkeypatch.setattr(hardware.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "arm64")
    assert hardware.resolve_dtype("auto") == torch.bfloat16


def test_real_cpuinfo_is_parsed_where_it_exists():
    flags = hardware.cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo on this platform")
    assert flags and all(isinstance(f, str) and " " not in f for f in flags)
    assert hardware.native_bf16("cpu") == bool(flags & hardware.NATIVE_BF16_CPU_FLAGS)


def test_mkl_path_set_on_amd_only_and_never_over_the_users_choice(cpu, monkeypatch):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.delenv("MKL_CBWR", raising=False)
    cpu({"avx2"}, vendor="GenuineIntel")
    assert hardware.configure_mkl() is None and "MKL_CBWR" not in hardware.os.environ
    cpu({"avx2"}, vendor="AuthenticAMD")
    assert hardware.configure_mkl() == "AUTO" and hardware.os.environ["MKL_CBWR"] == "AUTO"
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert hardware.configure_mkl() is None and hardware.os.environ["MKL_CBWR"] == "COMPATIBLE"
    monkeypatch.delenv("MKL_CBWR")
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert hardware.configure_mkl() is None and "MKL_CBWR" not in hardware.os.environ


def _speculative_generate(target):
    drafter = hf_spec.NGramDrafter()
    prompt = random_prompt(12, target.config.vocab_size)
    return target.generate(prompt, assistant_model=drafter, max_new_tokens=4, do_sample=False)


@pytest.mark.parametrize("native, dtype, warns", [(False, torch.bfloat16, True), (True, torch.bfloat16, False),
                                                  (False, torch.float32, False)])  # fmt: skip
def test_speculative_decoding_warns_once_on_emulated_bf16(monkeypatch, native, dtype, warns):
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": native)
    monkeypatch.setattr(hardware, "_warned", False)
    target = make_target().to(dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _speculative_generate(target)
        _speculative_generate(target)
    ours = [w for w in caught if "without native bf16" in str(w.message)]
    assert len(ours) == (1 if warns else 0)
    if warns:
        assert "float32" in str(ours[0].message)  # names the fix


def test_cli_dtype_defaults_to_auto_and_accepts_explicit_dtypes():
    parser = build_parser()
    for command in (["bench"], ["demo"], ["tune", "--drafter", "d"]):
        assert parser.parse_args(command).dtype == "auto"
        assert parser.parse_args([*command, "--dtype", "bfloat16"]).dtype == "bfloat16"


@pytest.mark.parametrize("native", [True, False])
def test_feature_caching_commands_run_the_target_in_the_native_dtype(monkeypatch, native):
    """Self-distillation and feature caching default to ``auto``: bf16 only where the CPU computes it
    natively (emulated bf16 made the distillation 3x slower on an AVX2-only EPYC)."""
    import hf_spec.training.data as data
    from hf_spec.training import distill
    from hf_spec.training.pipeline import DataArguments

    class Loaded(Exception):
        pass

    def load_target(name, dtype):
        raise Loaded(dtype)

    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": native)
    monkeypatch.setattr(data, "load_target", load_target)
    expected = torch.bfloat16 if native else torch.float32
    for run in (lambda: distill.main(["--output", "x"]), lambda: data.main(["features", "--output", "x"])):
        with pytest.raises(Loaded) as loaded:
            run()
        assert loaded.value.args[0] == expected
    assert DataArguments().feature_dtype == "auto"
