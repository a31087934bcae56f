"""training_scripts/compare_papers.py end to end on a tiny random target: teacher-forced top-1 per step for every
family (EAGLE-3 through the extended feature cache), τ at each paper's tree and the chain, outputs equal to plain
greedy, the table and the claims' verdicts."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

import hf_spec
from conftest import make_target, train_drafter_on_outputs
from hf_spec.training.collators import FeatureCollator
from hf_spec.training.data import add_layer_features, load_feature_cache, load_target
from hf_spec.training.distill import distill_features
from hf_spec.training.losses import shift_for_drafter
from test_training import _conversations, tiny_chat_tokenizer

SCRIPT = Path(__file__).resolve().parents[1] / "training_scripts" / "compare_papers.py"
_spec = importlib.util.spec_from_file_location("compare_papers", SCRIPT)
compare_papers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_papers)


@pytest.fixture(scope="module")
def papers_setup(tmp_path_factory):
    """(target dir, feature cache, drafter folders by method): a saved tiny target with its tokenizer, a
    self-distilled cache extended with the EAGLE-3 layers' inputs, and a drafter per method: EAGLE fitted to the
    target's outputs for a moment, "HASS" the same weights under another method name, the others untrained."""
    root = tmp_path_factory.mktemp("papers")
    tok = tiny_chat_tokenizer()
    target = make_target("llama", vocab_size=len(tok), seed=3)
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    cache = distill_features(target, tok, _conversations(6, seed=1), str(root / "features"), max_new_tokens=12,
                             max_prompt_tokens=32, batch_size=6, storage="float32")  # fmt: skip
    add_layer_features(cache, target, [0, 1])  # beside the cache, as train_eagle3.py writes it
    eagle = train_drafter_on_outputs(target, hf_spec.EagleDrafter.from_target(target), steps=150)
    drafters = {
        "eagle": eagle,
        "hass": hf_spec.EagleDrafter.from_target(target, training_method="hass"),
        "eagle3": hf_spec.Eagle3Drafter.from_target(target, eagle_aux_hidden_state_layer_ids=[0, 1]),
        "parallelspec": hf_spec.ParallelDrafter.from_target(target),
        "coral": hf_spec.EagleDrafter.from_target(target, training_method="coral"),
    }
    drafters["hass"].load_state_dict(eagle.state_dict())
    drafters["coral"].load_state_dict(eagle.state_dict())
    drafters["coral"].add_router(torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(0)),
                                 num_groups=4, top_n=1)  # an untrained router: drafts only a quarter of the vocabulary
    folders = {}
    for method, drafter in drafters.items():
        folders[method] = str(root / method)
        drafter.save_pretrained(folders[method])
    return str(root / "target"), cache, folders


@torch.no_grad()
def next_token_top1(folder, target_dir, cache):
    """Step-1 teacher-forced top-1 computed directly, one example at a time: the drafter's argmax at each answer
    position against the target's argmax on the next feature."""
    target, _ = load_target(target_dir)
    drafter = hf_spec.AutoDrafter.from_pretrained(folder, target=target).eval()
    dataset, storage = load_feature_cache(cache)
    hits = counted = 0
    for example in dataset.with_format("numpy"):
        batch = FeatureCollator(storage=storage)([example])
        ids, feats, feats_next, mask = shift_for_drafter(batch["input_ids"], batch["hidden_states"], batch["loss_mask"])
        logits = drafter(input_ids=ids, hidden_states=feats, output_logits=True).logits
        same = logits.argmax(-1) == target.lm_head(feats_next).argmax(-1)
        hits, counted = hits + int(same[mask.bool()].sum()), counted + int(mask.sum())
    return hits / counted


def test_compare_papers_end_to_end(papers_setup, tmp_path):
    target_dir, cache, folders = papers_setup
    results = compare_papers.main(["--drafters", *folders.values(), "--target", target_dir, "--prompts-per-set", "1",
                                   "--max-new-tokens", "8", "--tf-cache", cache, "--dtype", "float32",
                                   "--output-dir", str(tmp_path)])  # fmt: skip
    assert json.loads((tmp_path / "results.json").read_text())["drafters"][0]["path"] == folders["eagle"]
    rows = {r["training_method"]: r for r in results["drafters"]}
    assert list(rows) == ["eagle", "hass", "eagle3", "parallelspec", "coral", "coral+router"]
    assert rows["parallelspec"]["tf"]["kind"] == "parallel_depths" and rows["eagle3"]["tf"]["kind"] == "hass_steps"
    assert rows["eagle3"]["tf"]["cache"].endswith("+layers-0-1")
    for row in rows.values():
        tf = row["tf"]
        assert tf["note"] is None and tf["positions"] > 0, tf
        assert len(tf["top1"]) == 4 and all(0.0 <= v <= 1.0 for v in tf["top1"]), tf
        for shape in ("tree", "chain"):
            measured = row["shapes"][shape]
            assert set(measured["tau"]) == {"mt_bench", "humaneval", "gsm8k"}
            assert all(tau >= 1.0 for tau in measured["tau"].values()), measured
            assert measured["mismatches"] == [] and measured["cycles"] > 0
            assert measured["draft_ms_per_cycle"] > 0 and measured["verified_nodes_per_cycle"] >= 1
    # each paper's tree: EAGLE-2's 60 nodes (+ the root) at most; ParallelSpec's widths give exactly 60 + root
    assert rows["hass"]["shapes"]["tree"]["options"] == {"tree_depth": 6, "tree_top_k": 10, "tree_total_tokens": 60}
    assert rows["hass"]["shapes"]["tree"]["verified_nodes_per_cycle"] <= 61
    assert rows["parallelspec"]["shapes"]["tree"]["options"]["tree_widths"] == [4, 2, 2, 1, 1]
    assert rows["parallelspec"]["shapes"]["tree"]["verified_nodes_per_cycle"] == 61
    assert rows["eagle"]["shapes"]["chain"]["verified_nodes_per_cycle"] <= 6
    assert results["mismatches"] == 0
    # the fitted drafter is measured as one: high top-1, τ above 1, and the same numbers under another name
    assert rows["eagle"]["tf"]["top1"][0] > 0.5 and min(rows["eagle"]["shapes"]["tree"]["tau"].values()) > 1.5
    assert rows["hass"]["tf"] == rows["eagle"]["tf"]
    assert all(rows["hass"]["shapes"][s]["tau"] == rows["eagle"]["shapes"][s]["tau"] for s in ("tree", "chain"))
    # CORAL without its router is the fitted EAGLE under another name; through an untrained router it drafts
    # from a quarter of the vocabulary, so it accepts less
    assert rows["coral"]["shapes"]["tree"]["tau"] == rows["eagle"]["shapes"]["tree"]["tau"]
    assert rows["coral+router"]["tf"] == rows["coral"]["tf"] == rows["eagle"]["tf"]
    assert compare_papers.mean_tau(rows["coral+router"]) < compare_papers.mean_tau(rows["coral"])
    for method in ("eagle", "parallelspec"):  # step 1 / depth 0 is the plain next-token forward
        assert rows[method]["tf"]["top1"][0] == pytest.approx(next_token_top1(folders[method], target_dir, cache))
    verdicts = {c["method"]: c["verdict"] for c in results["claims"]}
    assert set(verdicts) == {"hass", "coral", "coral+router", "eagle3", "parallelspec"}
    assert verdicts["hass"] == "does not hold", results["claims"]  # equal numbers are no improvement
    assert all(v in ("holds", "does not hold") for v in verdicts.values()), results["claims"]
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n| ") == 1 + len(folders) + 1 and "## The papers' claims" in table  # CORAL: two rows

    # --cards-from puts each folder's row, the others beside it and its claims into its card
    compare_papers.main(["--cards-from", str(tmp_path / "results.json"), "--table", "benchmarks/papers/README.md"])
    coral = (Path(folders["coral"]) / "README.md").read_text()
    section = coral[coral.index("## Beside its paper"):coral.index("## Training")]
    assert "`benchmarks/papers/README.md`" in section and results["machine"] in section
    assert section.count(f"| **{folders['coral']}** |") == 2 and section.count("\n| ") == 1 + len(rows)  # its two rows in bold
    assert f"**coral: {verdicts['coral']}**" in section and f"**coral+router: {verdicts['coral+router']}**" in section
    assert "**hass: " not in section  # its own claims and those it is a baseline of, no others
    eagle = (Path(folders["eagle"]) / "README.md").read_text()
    assert all(f"**{m}: " in eagle for m in ("hass", "eagle3", "parallelspec")) and "**coral: " not in eagle
    info = json.loads((Path(folders["eagle"]) / "training_info.json").read_text())
    assert info["paper_comparison"]["drafter"] == folders["eagle"] and "paper_comparison" not in eagle.split("## Training")[1]


def _row(method, tf, taus, ms=1.0):
    shape = {"tau": {"mt_bench": taus, "gsm8k": taus}, "draft_ms_per_cycle": ms}
    return {"training_method": method, "tf": {"top1": tf}, "shapes": {"tree": shape, "chain": shape}}


def test_claims_hold_only_when_every_number_says_so():
    eagle = _row("eagle", [0.8, 0.6, 0.5, 0.4], 3.0, ms=4.0)
    hass = _row("hass", [0.8, 0.7, 0.6, 0.5], 3.2)
    coral = _row("coral", [0.8, 0.7, 0.6, 0.4], 3.1)
    parallel = _row("parallelspec", [0.8, 0.5, 0.3, 0.2], 2.5, ms=1.5)
    verdicts = {c["method"]: c["verdict"] for c in compare_papers.paper_claims([eagle, hass, coral, parallel])}
    assert verdicts == {"hass": "holds", "coral": "does not hold", "parallelspec": "holds"}
    worse_late = _row("hass", [0.8, 0.7, 0.6, 0.3], 3.2)  # step 4 below EAGLE's
    assert compare_papers.paper_claims([eagle, worse_late])[0]["verdict"] == "does not hold"
    cheap_router = _row("coral+router", [0.8, 0.7, 0.6, 0.4], 3.0, ms=0.5)  # -3% τ, half the drafting ms
    costly_router = _row("coral+router", [0.8, 0.7, 0.6, 0.4], 2.8, ms=0.5)  # -10% τ
    slow_router = _row("coral+router", [0.8, 0.7, 0.6, 0.4], 3.1, ms=1.0)  # no drafting ms saved
    for router, verdict in ((cheap_router, "holds"), (costly_router, "does not hold"), (slow_router, "does not hold")):
        assert compare_papers.paper_claims([coral, router])[-1]["verdict"] == verdict
    alone = compare_papers.paper_claims([hass])[0]
    assert alone["verdict"] == "not measured" and alone["missing_baselines"] == ["eagle"]


def test_eagle3_without_its_layers_in_the_cache_gets_a_note_not_numbers(papers_setup, tmp_path):
    target_dir, cache, folders = papers_setup
    bare = tmp_path / "bare"
    shutil.copytree(cache, bare)  # without the extended copy beside it
    target, _ = load_target(target_dir)
    drafter = hf_spec.AutoDrafter.from_pretrained(folders["eagle3"], target=target)
    tf = compare_papers.teacher_forced(drafter, str(bare), None, 4, 64)
    assert tf["top1"] == [None] * 4 and tf["positions"] == 0
    assert "--layers 0 1" in tf["note"] and str(bare) in tf["note"]
