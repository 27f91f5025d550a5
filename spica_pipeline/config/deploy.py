"""`deploy:`: how the picks are written out as DynamoGraphDeployment manifests."""

from typing import Literal

from spica_pipeline.config.types import PosInt, StrictModel


class DeploySettings(StrictModel):
    """Manifest rendering; none of it changes what is searched or how candidates are scored."""

    # How many picks get a deploy/<rank>/ folder: the ranking's head, or every front point up to this.
    top_n: PosInt = 10
    # nvidia.com/v1beta1 (spec.components) by default; v1alpha1 (spec.services) is deprecated upstream.
    api_version: Literal["v1beta1", "v1alpha1"] = "v1beta1"
    # Worker/frontend image; default: the backend's Dynamo runtime image at the pinned Dynamo version.
    image: str | None = None
    planner_image: str | None = None
    # GPUs per node; default: the AIC system spec of the hardware. Engines larger than this go multinode.
    gpus_per_node: PosInt | None = None
    # The model the workers load and the Frontend serves; default: search_space.model_name as written when
    # it is a Hugging Face id (org/name), else the aiconfigurator-core model the sweep timed.
    served_model: str | None = None
    # Secret with HF_TOKEN for model download, mounted into the workers; null leaves it out.
    hf_token_secret: str | None = "hf-token-secret"
