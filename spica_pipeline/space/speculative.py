"""Speculative decoding: which methods a model can run, and the numbers a replay of it needs.

A speculating engine drafts k tokens per decode step (MTP: the checkpoint's own multi-token-prediction
layers; EAGLE-3: a separate draft head) and verifies them in one target pass over k + 1 tokens per
request. What that costs comes from aiconfigurator-core (evaluate/timing.py: its decode step with the
draft layers, verifying k + 1 tokens, as AIC's own static generation step does); what it gains depends on
the traffic: draft position i is accepted with probability a_i once every earlier one was, so a step
yields 1 + sum_i prod_{j<=i} a_j tokens on average (`expected_tokens_per_step`), the rule the replay
samples by (ai-dynamo-runtime's `aic_nextn_accept_rates`).
"""

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from spica_pipeline.space.model_hw import QuietAIC, check_model

# the keys a Hugging Face config names its MTP layers by (DeepSeek/GLM/MiMo/Nemotron/Step: the first;
# Qwen3.5: the second). aiconfigurator-core enables MTP from the first alone (resolve_nextn_auto).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


@lru_cache(maxsize=256)
def mtp_layers(model_name: str) -> int:
    """The MTP layers a shipped model's checkpoint carries (0: none, so it cannot run MTP)."""
    check_model(model_name)
    from aiconfigurator_core.sdk.common import MULTIMODAL_TEXT_CONFIG_KEY
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    with QuietAIC():
        info = get_model_config_from_model_path(model_name)
    raw = info.get("raw_config") or {}
    text_key = MULTIMODAL_TEXT_CONFIG_KEY.get(str(info.get("architecture")))
    cfg = raw[text_key] if text_key and isinstance(raw.get(text_key), dict) else raw
    return max((int(cfg.get(k) or 0) for k in MTP_LAYER_KEYS), default=0)


def method_problem(model_name: str, method: str) -> str | None:
    """Why `model_name` cannot run `method` (None: it can). EAGLE-3 runs on any model given its draft
    head; MTP needs MTP layers in the checkpoint."""
    if method == "mtp" and mtp_layers(model_name) == 0:
        return (f"{model_name} has no MTP layers (its config sets none of {', '.join(MTP_LAYER_KEYS)}), so "
                "vLLM and SGLang cannot run mtp for it")
    return None


@dataclass(frozen=True)
class SpeculativeChoices:
    """The speculative knobs a sweep searches: the methods left, the draft-token counts (0 = off), and
    each dropped method with its reason. Empty `methods` means the knobs drop out of the search."""

    methods: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def searched(self) -> bool:
        return bool(self.methods) and any(k > 0 for k in self.tokens)

    def knobs(self) -> dict[str, list[Any]]:
        """The branch knobs (space/branches.knob_choices_for): none when nothing is left to search."""
        if not self.searched:
            return {}
        return {"speculative_method": list(self.methods), "speculative_num_tokens": list(self.tokens)}

    def warnings(self) -> list[str]:
        out = [f"smart-sweep: speculative_method '{m}' dropped: {why}" for m, why in self.dropped.items()]
        if self.dropped and not self.methods:
            out.append("smart-sweep: no speculative method is left, so every candidate decodes without one")
        return out


def speculative_choices(space: Any) -> SpeculativeChoices:
    """What `space` (a SearchSpace) searches of speculative decoding. `none` among the methods adds the
    0-token (off) choice; a method the model cannot run is dropped with its reason."""
    if not getattr(space, "speculative_on", False):  # (a stand-in space without the fields: off)
        return SpeculativeChoices()
    listed = list(space.speculative_method)
    dropped = {m: why for m in listed if m != "none" and (why := method_problem(space.model_name, m))}
    methods = tuple(m for m in listed if m != "none" and m not in dropped)
    tokens = list(space.speculative_num_tokens)
    if "none" in listed and 0 not in tokens:
        tokens.insert(0, 0)
    return SpeculativeChoices(methods, tuple(tokens), dropped)


def expected_tokens_per_step(rates: Sequence[float] | None) -> float:
    """Mean tokens one speculative decode step yields: 1 + sum_i prod_{j<=i} a_j (1 without drafts)."""
    total, survive = 1.0, 1.0
    for a in rates or ():
        survive *= float(a)
        total += survive
    return total


def draft_kv_layers(model_name: str, draft_tokens: int) -> int:
    """Layers of draft KV an engine keeps per token: the MTP layers it runs (at most one per draft token),
    or one for a draft head (EAGLE-3's single decoder layer) on a model without MTP layers."""
    if draft_tokens <= 0:
        return 0
    return max(1, min(int(draft_tokens), mtp_layers(model_name)))
