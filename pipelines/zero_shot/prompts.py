"""Classes as lists of prompts, their text embeddings (cached per prompt set) and the class scores.

A prompt file (YAML: `classes`, each with one or more names, and optional `templates` in which
`CLASSNAME` is replaced by each name; docs/zero_shot.md) or CONCH's own JSON prompt file names the
classes; without templates the model's authors' ensemble is used. A class's embedding is the
normalised mean of its normalised prompt embeddings (CONCH zeroshot_path.py zero_shot_classifier;
TITAN's the same); PRISM instead softmaxes over every prompt and sums each class's probabilities
(modeling_prism.py zero_shot).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from wsi.core.errors import ConfigError
from wsi.core.user_text import load_json_file, load_yaml_file

log = logging.getLogger("wsi.pipelines.zero_shot")

PLACEHOLDER = "CLASSNAME"


@dataclass(frozen=True)
class PromptSet:
    """Class -> names, and the templates every name is put into."""

    classes: dict[str, tuple[str, ...]]
    templates: tuple[str, ...]
    source: str = ""

    @classmethod
    def from_classes(
        cls,
        classes: dict[str, list[str]] | dict[str, tuple[str, ...]],
        templates: tuple[str, ...] | list[str],
        source: str = "",
    ) -> PromptSet:
        if len(classes) < 2:
            raise ConfigError(f"{source or 'prompts'}: give at least two classes (found {len(classes)})")
        out: dict[str, tuple[str, ...]] = {}
        for name, names in classes.items():
            names = [names] if isinstance(names, str) else list(names)
            if not names or not all(isinstance(n, str) and n.strip() for n in names):
                raise ConfigError(f"{source or 'prompts'}: class {name!r} needs one or more non-empty names")
            out[str(name)] = tuple(n.strip() for n in names)
        templates = tuple(templates)
        bad = [t for t in templates if PLACEHOLDER not in t]
        if not templates or bad:
            raise ConfigError(
                f"{source or 'prompts'}: every template must contain {PLACEHOLDER} "
                f"({bad[:2] or 'none given'})"
            )
        return cls(out, templates, source)

    @property
    def names(self) -> list[str]:
        return list(self.classes)

    def prompts(self) -> tuple[list[str], np.ndarray]:
        """Every prompt, and the class index of each (classes, then names, then templates)."""
        texts: list[str] = []
        groups: list[int] = []
        for c, names in enumerate(self.classes.values()):
            for name in names:
                for template in self.templates:
                    texts.append(template.replace(PLACEHOLDER, name))
                    groups.append(c)
        return texts, np.asarray(groups, dtype=np.int64)

    def digest(self) -> str:
        data = json.dumps({"classes": self.classes, "templates": self.templates}, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()


def packaged_prompts() -> list[str]:
    return sorted(
        p.name.removesuffix(".yaml")
        for p in resources.files("wsi.configs").joinpath("prompts").iterdir()
        if p.name.endswith(".yaml")
    )


def load_prompts(source: str | Path, default_templates: tuple[str, ...]) -> PromptSet:
    """A prompt file (YAML or CONCH's JSON; a URL: its local copy) or a packaged prompt set's name
    (`nsclc`). A pipe or device is refused naming it, not taken for a missing file."""
    from wsi.core.files import check_regular_file
    from wsi.storage import is_url, local_file

    if is_url(str(source)):  # never Path(url), which folds s3:// to s3:/; credentials are refused
        source = local_file(str(source), what="prompt file")
    path = Path(source)
    check_regular_file(path, "prompt file")
    if not path.is_file():
        packaged = resources.files("wsi.configs").joinpath("prompts", f"{source}.yaml")
        if not packaged.is_file():
            raise ConfigError(
                f"prompts {source}: no such file or packaged prompt set "
                f"(packaged: {', '.join(packaged_prompts())})"
            )
        path = Path(str(packaged))
    data: Any
    if path.suffix == ".json":
        data = load_json_file(path, what="prompt file", error=ConfigError)
        if isinstance(data, dict) and "classes" not in data and len(data) == 1:
            data = next(iter(data.values()))  # CONCH's {"0": {...}}
    else:
        data = load_yaml_file(path, what="prompt file")
    example = "classes: {LUAD: [adenocarcinoma], LUSC: [squamous cell carcinoma]}"
    if data is None or data == {}:
        raise ConfigError(f"{path} is empty: a prompt file names two or more classes, e.g. {example}")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a prompt file is a mapping with `classes` (and optional `templates`), e.g. {example}"
        )
    classes = data.get("classes", data.get("classnames"))
    if not isinstance(classes, dict):
        raise ConfigError(f"{path}: `classes` must map each class to its names, e.g. LUAD: [adenocarcinoma]")
    unknown = set(data) - {"classes", "classnames", "templates", "description", "source"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; use classes and templates")
    templates = data.get("templates") or default_templates
    if not isinstance(templates, (list, tuple)):
        raise ConfigError(f"{path}: `templates` is a list of strings containing {PLACEHOLDER}")
    return PromptSet.from_classes(classes, tuple(str(t) for t in templates), source=str(path))


@dataclass
class TextClassifier:
    """The prompt set's embeddings in the joint space and how they become class probabilities."""

    classes: list[str]
    prompt_emb: torch.Tensor  # (P, D) unit rows
    groups: np.ndarray  # (P,) class of each prompt
    mode: str  # "mean-embedding" | "sum-probability"
    scale: float  # the authors' logit scale (temperature)

    @property
    def class_emb(self) -> torch.Tensor:
        """(C, D): the normalised mean of each class's normalised prompt embeddings."""
        rows = [
            F.normalize(self.prompt_emb[self.groups == c].mean(0), dim=0) for c in range(len(self.classes))
        ]
        return torch.stack(rows)

    def similarities(self, joint: torch.Tensor) -> torch.Tensor:
        """(N, D) unit image embeddings -> (N, C) cosine similarity to each class (mean-embedding), or to the
        class's best prompt (sum-probability: for maps only; probabilities use every prompt)."""
        if self.mode == "mean-embedding":
            return joint.float() @ self.class_emb.T
        sims = joint.float() @ self.prompt_emb.T
        return torch.stack([sims[:, self.groups == c].amax(1) for c in range(len(self.classes))], 1)

    def probabilities(
        self, pooled: torch.Tensor | None = None, joint: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(S, C) probabilities: softmax(scale * pooled class similarities), or for PRISM the per-prompt
        softmax of the slide embedding `joint` summed per class."""
        if self.mode == "mean-embedding":
            assert pooled is not None
            return torch.softmax(self.scale * pooled.float(), dim=-1)
        assert joint is not None
        probs = torch.softmax(self.scale * (joint.float() @ self.prompt_emb.T), dim=-1)
        return torch.stack([probs[:, self.groups == c].sum(1) for c in range(len(self.classes))], 1)


def class_embeddings(tower: Any, prompts: PromptSet) -> torch.Tensor:
    """(C, D) class embeddings as the authors' zero_shot_classifier makes them (no cache)."""
    texts, groups = prompts.prompts()
    emb = tower.encode_text(texts)
    return TextClassifier(prompts.names, emb, groups, "mean-embedding", 1.0).class_emb


def text_classifier(tower: Any, prompts: PromptSet, cache_dir: Path | None) -> TextClassifier:
    """The prompt set's classifier; its prompt embeddings are cached in `cache_dir` under the tower, its
    weights and the prompt set's digest, so a second run with the same prompts encodes nothing."""
    from safetensors.torch import load_file, save_file

    texts, groups = prompts.prompts()
    key = f"{tower.name}-{tower.weights_sha256[:16]}-{prompts.digest()[:16]}"
    path = cache_dir / f"{key}.safetensors" if cache_dir is not None else None
    emb = None
    if path is not None and path.is_file() and tower.weights_sha256 != "random":
        try:
            emb = load_file(str(path))["prompt_emb"]
            if emb.shape[0] != len(texts):
                emb = None
        except Exception as exc:  # a damaged cache file is re-made
            log.warning("text embedding cache %s unreadable (%s); encoding again", path, exc)
            emb = None
    if emb is None:
        emb = tower.encode_text(texts)
        if path is not None and tower.weights_sha256 != "random":
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            save_file({"prompt_emb": emb.contiguous()}, str(tmp))
            tmp.replace(path)
    return TextClassifier(prompts.names, emb, groups, tower.SPEC.prompt_pooling, tower.logit_scale())


def top_k_mean(sims: torch.Tensor, k: int) -> torch.Tensor:
    """(N, C) tile similarities -> (C,) mean of each class's k highest (MI-Zero; CONCH zeroshot_path.py
    topj_pooling): a slide is as much a class as its most typical tiles are."""
    k = min(k, sims.shape[0])
    return sims.topk(k, dim=0).values.mean(0)
