"""S2D self-distillation labels: chunked-head argmax and the resumable on-disk labels cache."""

import shutil

import pytest
import torch

from conftest import make_target, random_prompt
from hf_spec.training.s2d_trainer import cached_teacher_labels, teacher_labels

LENGTHS = (7, 12, 4, 1, 9, 15, 2)  # unequal rows (right-padded batches), one with nothing to label


def make_rows(lengths=LENGTHS, seed=0):
    return [{"input_ids": random_prompt(n, seed=seed + n)[0].tolist(), "labels": []} for n in lengths]


@torch.no_grad()
def full_logits_labels(teacher, rows, batch_size):
    """The straightforward labelling: full logits of each padded batch, argmax over the whole vocabulary."""
    out = []
    for begin in range(0, len(rows), batch_size):
        chunk = rows[begin : begin + batch_size]
        length = max(len(r["input_ids"]) for r in chunk)
        ids = torch.zeros((len(chunk), length), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(chunk):
            ids[i, : len(r["input_ids"])] = torch.as_tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        greedy = teacher(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        out += [{"input_ids": r["input_ids"], "labels": [-100] + greedy[i, : len(r["input_ids"]) - 1].tolist()}
                for i, r in enumerate(chunk)]  # fmt: skip
    return out


class CountingTeacher:
    """Loader of ``teacher`` that counts loads and the rows its base model is run over."""

    def __init__(self, teacher):
        self.teacher, self.loads, self.rows = teacher, 0, 0
        teacher.base_model.register_forward_hook(lambda module, args, kwargs, out: self.count(kwargs), with_kwargs=True)

    def count(self, kwargs):
        self.rows += kwargs["input_ids"].shape[0]

    def __call__(self):
        self.loads += 1
        return self.teacher


def no_teacher():
    raise AssertionError("the teacher was loaded although every labels shard exists")


CASES = [("llama", torch.float32), ("qwen2", torch.float32), ("llama", torch.bfloat16)]


@pytest.mark.parametrize("family,dtype", CASES)
def test_chunked_head_argmax_equals_full_logits_argmax(family, dtype):
    teacher = make_target(family, vocab_size=128).to(dtype)
    rows = make_rows()
    expected = full_logits_labels(teacher, rows, batch_size=3)
    for head_rows in (1, 5, 256):  # chunks that split rows, and one chunk for the whole batch
        assert teacher_labels(teacher, rows, batch_size=3, head_rows=head_rows) == expected
    assert expected[3]["labels"] == [-100]
    assert len({tuple(r["labels"][1:]) for r in expected if len(r["labels"]) > 1}) > 1  # not a constant labelling
    # and each row alone, unpadded, gets the same labels (padding never leaks into real positions)
    assert [teacher_labels(teacher, [r], head_rows=4)[0] for r in rows] == expected


def test_labels_cache_is_reused_without_the_teacher(tmp_path):
    teacher = make_target("llama", vocab_size=128)
    rows = make_rows()
    loader = CountingTeacher(teacher)
    first = cached_teacher_labels(loader, rows, str(tmp_path), shard_rows=3, batch_size=3, teacher_name="tiny")
    assert loader.loads == 1 and loader.rows == len(rows)
    assert first == teacher_labels(teacher, rows, batch_size=3)
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == ["shard-00000", "shard-00001", "shard-00002"]
    again = cached_teacher_labels(no_teacher, rows, str(tmp_path), shard_rows=3, batch_size=3, teacher_name="tiny")
    assert again == first


def test_labels_cache_refuses_other_rows_or_teacher(tmp_path):
    teacher = make_target("llama", vocab_size=128)
    rows = make_rows()
    cached_teacher_labels(teacher, rows, str(tmp_path), shard_rows=3, teacher_name="tiny")
    edited = [dict(r) for r in rows]
    edited[4] = {"input_ids": edited[4]["input_ids"][:-1] + [edited[4]["input_ids"][-1] % 127 + 1], "labels": []}
    with pytest.raises(ValueError, match=r"holds other examples.*Fix: give a new output directory"):
        cached_teacher_labels(no_teacher, edited, str(tmp_path), shard_rows=3, teacher_name="tiny")
    with pytest.raises(ValueError, match=r"holds other examples"):  # same rows, other shard size
        cached_teacher_labels(no_teacher, rows, str(tmp_path), shard_rows=2, teacher_name="tiny")
    with pytest.raises(ValueError, match=r"beyond the 1 this run writes.*Fix: give a new output directory"):
        cached_teacher_labels(no_teacher, rows[:3], str(tmp_path), shard_rows=3, teacher_name="tiny")
    with pytest.raises(ValueError, match=r"labels of 'tiny', not of 'other'.*Fix: give another --labels_cache"):
        cached_teacher_labels(no_teacher, rows, str(tmp_path), shard_rows=3, teacher_name="other")


def test_partial_labels_cache_is_completed(tmp_path):
    teacher = make_target("qwen2", vocab_size=128)
    rows = make_rows()
    full = cached_teacher_labels(teacher, rows, str(tmp_path / "full"), shard_rows=3, teacher_name="tiny")
    shutil.copytree(tmp_path / "full", tmp_path / "partial")
    shutil.rmtree(tmp_path / "partial" / "shard-00002")  # a run killed before its last shard
    (tmp_path / "partial" / "shard-00001" / "dataset_info.json").unlink()  # and one killed while writing a shard
    loader = CountingTeacher(teacher)
    resumed = cached_teacher_labels(loader, rows, str(tmp_path / "partial"), shard_rows=3, teacher_name="tiny")
    assert loader.loads == 1 and loader.rows == 3 + 1  # only the rows of the two unfinished shards
    assert resumed == full == teacher_labels(teacher, rows)
