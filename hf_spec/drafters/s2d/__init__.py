"""S2D sorted drafter: the first L layers of a small causal LM with early exits (arXiv 2407.01955).

The drafter is a standalone small LM (its own embedding, final norm and LM head; unlike
EAGLE it does not borrow anything from the target) made of the first ``num_layers``
decoder layers of a *source* model. Exits sit after the layers listed in ``exits``; every
exit goes through the shared final norm and LM head, so each exit is a sub-model
("sorted fine-tuning" trains all of them at once, :func:`hf_spec.drafters.s2d.losses.sorted_loss`).

Drafting (Alg. 1, §3.3): for each draft token, run the layers up to the first exit; if the
exit's confidence (max probability of its distribution) reaches that exit's threshold the
token is drafted there, else computation continues through the next layers from where it
stopped. One checkpoint serves several targets: ``config.targets`` lists each with its own
thresholds (small targets favour the small sub-models, large ones the deep ones, §4.4.1).

Default exits for Qwen2.5-Coder-0.5B (24 layers): ``num_layers=8, exits=(4, 6, 8)``. The
paper keeps 12 of Vicuna-7B's 32 layers (3/8) with exits at 1/2, 3/4 and all of the drafter
(6/9/12). One third of the 0.5B (8 layers) keeps the drafter's *layers* at about 1/10 of
the Qwen-1.5B target's per-token cost, and 4/6/8 are the same 1/2, 3/4, 1 split. One
difference from Vicuna matters for choosing thresholds: Qwen's LM head (151936 x 896,
in the packaged checkpoint a separate matrix, not tied to the embedding) holds about as many weights as 9 of its decoder layers (a layer is
~14.9 M), while Vicuna's head is smaller than one of its layers. So every exit *tried*
costs ~9 layers of head on top of the layers: an exit at layer 4 saves 4 layers when it
fires and costs a head when it does not. Early exits pay off only for targets where they
fire often; :func:`search_thresholds` measures this per target, and thresholds above 1
(always the full 8-layer sub-model) are among its candidates. An exit whose threshold is
above 1 can never fire, so its head is skipped: thresholds ``[2, 2, 0]`` cost exactly the
8-layer sub-model, ``[0, 0, 0]`` exactly the 4-layer one (:meth:`SortedDrafter.use_fixed_exit`).

KV-cache scheme (lazy catch-up). Exits split the layers into segments. The session keeps
one KV cache for all layers, and for every segment ``s`` > 0 the count ``done[s]`` of
positions it has processed plus ``pending[s]``: the segment's *input* hidden states (the
previous segment's output) for positions ``done[s] .. done[s-1]-1``, i.e. the tokens that
exited early before reaching it. Whenever a token must go through segment ``s``, the
segment runs on all its pending inputs at once (causal over its own cache), which fills in
the K/V of the earlier early-exited positions first; its outputs become pending inputs of
the next segment. Every layer therefore sees exactly the K/V it would have in a full
forward, so each exit's distribution equals that of the truncated model on the same text
(tested). After drafting, the session drops everything at positions >= the committed
length (per-layer cache crop and pending truncation); catch-up work done on committed
positions is kept.

Cheap training and small checkpoints (issue #16). With a draft vocabulary
(``set_draft_vocab``; :mod:`hf_spec.draft_vocab`, the d2t/t2d map of the other families) every
exit scores only those D rows of the shared head (the head is most of a step's cost for Qwen)
and training ignores labels outside it; verification stays over the full target vocabulary, so
decoding is lossless. With :meth:`SortedDrafter.add_lora` the layers carry ``peft`` LoRA
adapters and only adapters, the final (exit) norm and the draft map are trained and saved;
the layers' base weights, embedding and head are the source model's, borrowed at bind time
(from the target when it is the source, else from :meth:`SortedDrafter.attach_source` or by
loading ``source_model_name_or_path``), adapters merged into the copied layers.

Exit adapters on a frozen backbone (:meth:`SortedDrafter.add_exit_adapters`; issue #16's CPU recipe): all
of the source's layers are kept and frozen, every exit but the last gets its own linear map + norm, trained
by distillation from the last exit, which is the source itself (e.g. the 0.5B drafting for the 1.5B); the
checkpoint holds adapters, norm and draft map and borrows the rest as with LoRA. ``tree_min_prob`` stops a
chain at the first token whose cumulative draft probability falls below it.

Losslessness in sampling: the exit is chosen from the exit's distribution (its max
probability) *before* the draft token is drawn, then the token is drawn from the chosen
exit's (temperature-scaled) distribution q, and q is stored in the tree; the choice depends
on the context only, never on the token drawn, so the chain meets the verifier's
conditions (:mod:`hf_spec.verify`). (Alg. 1 writes "x, c ~ p_S"; taking c as the sampled
token's own probability would make q depend on the draw.)

The package, by concern (its modules import each other by module, never this package): :mod:`.config`
(:class:`SortedDrafterConfig`, :func:`target_entry`), :mod:`.model` (:class:`SortedDrafter`), :mod:`.session`
(:class:`SortedDraftingSession`, the KV-cache scheme above), :mod:`.losses` (what ``forward`` computes with
labels) and :mod:`.thresholds` (:func:`search_thresholds`).
"""

from .config import SortedDrafterConfig, default_exits, target_entry
from .losses import exit_distillation_loss, sorted_loss
from .model import LORA_TARGET_MODULES, SortedDrafter, SortedDrafterOutput
from .session import SortedDraftingSession
from .thresholds import search_thresholds, threshold_grid

__all__ = ["LORA_TARGET_MODULES", "SortedDrafter", "SortedDrafterConfig", "SortedDrafterOutput", "SortedDraftingSession",
           "default_exits", "exit_distillation_loss", "search_thresholds", "sorted_loss", "target_entry",
           "threshold_grid"]
