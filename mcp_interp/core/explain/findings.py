"""How ``explain`` turns patched heads into sentences: their total and direct effects, and the route between."""

from __future__ import annotations

from mcp_interp.core.lens.logit_lens import EMBED_LAYER
from mcp_interp.schemas.explain import CausalHead
from mcp_interp.schemas.heads import PatchHeadsMeasurement
from mcp_interp.schemas.lens import DLAMeasurement


def causal_heads(
    patching: PatchHeadsMeasurement, clean: DLAMeasurement, corrupt: DLAMeasurement, top_k: int
) -> list[CausalHead]:
    """The top patched heads with their total and direct effects, in logits.

    A head's direct effect is the DLA of its *change*: output(clean) − output(corrupt) at the answer
    position, read through the unembedding with the corrupt run's final-norm scale frozen (the run
    being patched). DLA terms are linear in the output, so the clean term rescaled to the corrupt
    scale minus the corrupt term is exactly that. Comparing it with the patch's total effect says how
    much of the effect is direct; comparing the clean-run DLA with the patch score would not, since a
    head can write a lot in both runs and change nothing.
    """
    corrupt_ld = patching.corrupt_logit_diff.value
    rescale = clean.final_norm_scale / corrupt.final_norm_scale
    heads = []
    for h in patching.heads[:top_k]:
        clean_term, corrupt_term = clean.heads[h.layer][h.head_index], corrupt.heads[h.layer][h.head_index]
        heads.append(
            CausalHead(
                head=h.head,
                recovered_fraction=h.score,
                dla=clean_term,
                patch_effect=h.patched_logit_diff - corrupt_ld,
                direct_effect=clean_term * rescale - corrupt_term,
            )
        )
    return heads


NEGLIGIBLE_EFFECT = 0.1  # logits: a patch that moves the logit difference less than this gets no sentence
MOSTLY = 0.25  # a share below this of the total effect is "a small part"


def route_finding(head: str, total: float, direct: float, last_layer: bool = False) -> str | None:
    """How a head's patch effect reaches the logits: directly, or through what reads it after (its own layer's MLP,
    and later layers unless the head is in the last one); None if negligible."""
    if abs(total) < NEGLIGIBLE_EFFECT:
        return None
    indirect = total - direct
    after = "its layer's MLP (the last layer)" if last_layer else "later components (its layer's MLP, later layers)"
    numbers = f"patching it moves the logit difference by {total:+.3f}, of which {direct:+.3f} is its changed output "
    numbers += f"read directly by the unembedding and {indirect:+.3f} passes through {after}"
    if abs(indirect) <= MOSTLY * abs(total):
        return f"{head} acts mostly directly: {numbers}."
    if abs(direct) <= MOSTLY * abs(total) or direct * total < 0:
        return f"{head} acts mostly through {after}: {numbers}."
    return f"{head} acts both directly and through {after}: {numbers}."


def layer_words(layer: int) -> str:
    """A logit-lens layer index in words: −1 is the embedding row (before block 0), else "layer N"."""
    return "the embedding (before layer 0)" if layer == EMBED_LAYER else f"layer {layer}"
