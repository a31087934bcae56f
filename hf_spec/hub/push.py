"""``push_to_hub`` for drafters through huggingface_hub's public API.

transformers' ``PushToHubMixin.push_to_hub`` calls ``save_pretrained`` (so our remote code and
``auto_map`` would go along) but then overwrites README.md with the card already on the Hub or a
generic one. This version saves everything hf-spec writes (weights, config with ``auto_map``,
remote code, the hf-spec card named after the repo) into a temporary folder and uploads it with
``HfApi.create_repo`` + ``HfApi.upload_folder`` in one commit.
"""

from __future__ import annotations

import tempfile

from huggingface_hub import HfApi


def push_drafter_to_hub(
    model,
    repo_id: str,
    *,
    bench_results=None,
    training_info: dict | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: bool | str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    endpoint: str | None = None,
) -> str:
    """Upload ``model`` to ``repo_id``; returns the commit URL (or the PR URL with ``create_pr``)."""
    from .cards import write_model_card

    api = HfApi(endpoint=endpoint, token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as tmp_dir:
        model.save_pretrained(tmp_dir, max_shard_size=max_shard_size, bench_results=bench_results,
                              training_info=training_info)  # fmt: skip
        write_model_card(model.config, tmp_dir, bench_results=bench_results, training_info=training_info,
                         model_name=repo_id)  # fmt: skip
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=tmp_dir,
            commit_message=commit_message or f"Upload hf-spec {type(model).__name__}",
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
        )
    return commit.pr_url if create_pr and getattr(commit, "pr_url", None) else commit.commit_url
