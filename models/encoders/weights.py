"""Weights from a file or a model folder, read as tensors only and checked key by key.

A checkpoint is an untrusted file: it is read with `torch.load(weights_only=True)` or safetensors, never
unpickled into objects. The authors' tensor names are mapped to ours by the recipe's key layout (a
registry below, one small function per layout); then every key is checked against the architecture and
the load is all or nothing: missing, unexpected and wrongly shaped tensors are listed by name.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from wsi.core.errors import WeightsError
from wsi.core.registry import Registry
from wsi.core.user_text import load_json_file
from wsi.models.encoders.recipe import EncoderRecipe
from wsi.storage.hf import check_inside_cache, hub_weights, is_ref, parse_ref, repo_of
from wsi.storage.urls import is_url

log = logging.getLogger("wsi.models.encoders")

StateDict = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------------------- reading
def _unwrap(obj: object, path: Path) -> StateDict:
    for _ in range(3):  # {"state_dict": {...}}, {"model": {...}}, {"model": {"state_dict": ...}}
        if isinstance(obj, dict):
            for key in ("state_dict", "model", "model_state_dict", "module"):
                if isinstance(obj.get(key), dict):
                    obj = obj[key]
                    break
            else:
                break
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(f"{path} holds no state dict (found {type(obj).__name__}); give a weights file")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise WeightsError(f"{path} holds a dict without tensors (keys {list(obj)[:5]}); not a weights file")
    out: StateDict = {}
    for key, value in tensors.items():
        for prefix in ("module.", "_orig_mod."):  # DataParallel / torch.compile wrappers
            while key.startswith(prefix):
                key = key[len(prefix) :]
        out[key] = value
    return out


def _refuse_text(path: Path) -> None:
    """A text file given as weights (a README, a download page saved as HTML, a git-lfs pointer): say so
    by name instead of the unpickler's 'pop from empty list'. Checkpoints start with binary bytes."""
    try:
        with path.open("rb") as fh:
            head = fh.read(512)
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror or exc}") from None
    if not head or b"\0" in head:
        return
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return  # binary
    if text.startswith("{") and path.suffix == ".safetensors":
        return  # never a safetensors start (8-byte length first), but let safetensors say so
    first = text.strip().splitlines()[0][:80] if text.strip() else ""
    hint = " (a git-lfs pointer: run `git lfs pull`)" if first.startswith("version https://git-lfs") else ""
    raise WeightsError(
        f"{path} is a text file, not weights{hint}; it starts with {first!r}. Give the checkpoint file "
        "(.safetensors, .bin, .pth) or the model folder"
    )


def load_state_dict_file(path: str | os.PathLike[str]) -> StateDict:
    """Tensors from a checkpoint without ever unpickling objects (weights_only / safetensors)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    _refuse_text(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return _unwrap(load_file(str(path), device="cpu"), path)
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"{path} is not a readable safetensors file ({exc})") from None
    try:
        try:  # memory-mapped: a 4 GB giant is not copied before load_state_dict copies it
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (pre-zip) format
    except pickle.UnpicklingError as exc:
        # torch's message is long and coloured; keep only the line naming the refused object
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        found = [ln.strip() for ln in text.splitlines() if "GLOBAL" in ln]
        if not found:  # not a pickle of objects at all: damaged or some other file
            after = text.split("WeightsUnpickler error:", 1)
            lines = [ln.strip() for ln in (after[1] if len(after) > 1 else "").splitlines() if ln.strip()]
            raise WeightsError(_not_a_checkpoint(path, lines[0] if lines else "")) from None
        what = f" ({found[0].split(' was not an allowed')[0]})"
        raise WeightsError(
            f"{path} contains Python objects other than tensors{what}; they are not loaded because "
            "unpickling can run arbitrary code. Save only the state dict: torch.save(model.state_dict(), ...)"
        ) from None
    except Exception as exc:  # an untrusted file: torch's unpickler fails in many ways on garbage
        first = str(exc).strip().split(". ")[0][:200]  # torch's first sentence: the rest is advice
        raise WeightsError(_not_a_checkpoint(path, f"{type(exc).__name__}: {first}")) from None
    return _unwrap(obj, path)


def _not_a_checkpoint(path: Path, why: str) -> str:
    """What a file torch cannot read at all is, and what to do. Only torch's reason is kept: its advice
    for the unpickler (re-run with weights_only=False) is the unsafe way around it."""
    detail = f" ({why})" if why else ""
    return (
        f"{path} is not a PyTorch checkpoint: its bytes are not what torch.save writes{detail}. It is "
        "damaged (download it again and compare its sha256) or another kind of file; give the checkpoint "
        "(.safetensors, .bin, .pth) or the model folder"
    )


def located_weights(
    weights: str | os.PathLike[str] | None, recipe: EncoderRecipe, name: str
) -> str | os.PathLike[str] | None:
    """--weights as given (a file or a model folder), a URL's local copy, or from the Hugging Face cache:
    `hf:ORG/REPO`, or nothing given for a recipe whose source is on the Hub (the snapshot folder, so that
    its config.json is checked too). None: nothing given and not a Hub model."""
    if weights is not None and not is_ref(weights) and not is_url(weights):
        return weights  # a file or a model folder: resolve_weights_path checks it
    repo = repo_of(recipe.source)
    found = hub_weights(
        weights, repo=repo, files=recipe.weights_files, what=f"encoder {name!r}", licence=recipe.licence,
        page=f"https://huggingface.co/{repo}" if repo else "",
    )  # fmt: skip
    whole = weights is None or (is_ref(weights) and not parse_ref(os.fspath(weights)).filename)
    if found is not None and whole:  # a repository: its snapshot folder, every file of it inside the cache
        owner = parse_ref(os.fspath(weights)).repo if weights is not None else str(repo)
        check_inside_cache(found.parent, owner)
        return found.parent
    return found


def resolve_weights_path(
    path: str | os.PathLike[str], recipe: EncoderRecipe, name: str, facts: dict[str, int] | None = None
) -> Path:
    """The weights file itself, or the one inside a model folder laid out as the authors' hub repository.

    facts: the built architecture's embed_dim, depth, patch_size, num_heads, reg_tokens, checked against
    the folder's config.json so that a folder of another model is named as such before any tensor is read.
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise WeightsError(f"weights {path} does not exist; give the weights file or the model folder")
    _check_folder_config(path, recipe, name, facts or {})
    for candidate in recipe.weights_files:
        if (path / candidate).is_file():
            return path / candidate
    present = sorted(p.name for p in path.iterdir())[:10]
    raise WeightsError(
        f"model folder {path} has none of {', '.join(recipe.weights_files)} for encoder {name!r} "
        f"(it holds {', '.join(present) or 'nothing'}); give the weights file itself"
    )


def _check_folder_config(folder: Path, recipe: EncoderRecipe, name: str, facts: dict[str, int]) -> None:
    """A hub folder's config.json must describe this architecture (catches UNI weights given as UNI2-h)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        return
    config = load_json_file(config_path, what="model folder config", error=WeightsError)
    if not isinstance(config, dict):
        return
    found = config.get("architecture")  # timm hub layout: {"architecture": ..., "model_args": {...}}
    if isinstance(found, str) and found.split(".")[0] != recipe.arch.split(".")[0]:
        raise WeightsError(
            f"{config_path} is for architecture {found!r}, but encoder {name!r} is {recipe.arch!r}; "
            "is this the folder of another model?"
        )
    model_args = config.get("model_args")
    args: dict[str, object] = model_args if isinstance(model_args, dict) else {}
    hf = {  # transformers' names for the same facts (Dinov2Config)
        "embed_dim": "hidden_size",
        "depth": "num_hidden_layers",
        "patch_size": "patch_size",
        "num_heads": "num_attention_heads",
        "reg_tokens": "num_register_tokens",
    }
    for key in ("embed_dim", "depth", "patch_size", "reg_tokens", "num_heads"):
        want = facts.get(key)
        got = args.get(key, config.get(hf.get(key, "")))  # transformers layout names the same facts
        if isinstance(want, int) and isinstance(got, int) and want != got:
            raise WeightsError(
                f"{config_path} says {key} = {got}, but encoder {name!r} has {key} = {want}; "
                "is this the folder of another model?"
            )


# ------------------------------------------------------------------------------------- key layouts
# Each layout maps the authors' tensor names to ours: backbone.* (the timm model) and pool.* (pooling head).
KEY_LAYOUTS: Registry[Callable[[StateDict, nn.Module], StateDict]] = Registry(
    "weights key layout", modules=("wsi.models.encoders.clip_vision",)
)


@KEY_LAYOUTS.register("timm")
def _timm_layout(state: StateDict, encoder: nn.Module) -> StateDict:
    """The checkpoint is the timm/torchvision model's own state dict (UNI, Virchow2, H-optimus, RetCCL)."""
    return {f"backbone.{k}": v for k, v in state.items()}


_HF_DINOV2 = [  # transformers Dinov2Model names -> timm VisionTransformer names
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.norm(\d)\.", r"blocks.\1.norm\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layer\.(\d+)\.layer_scale(\d)\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^encoder\.layer\.(\d+)\.mlp\.fc(\d)\.", r"blocks.\1.mlp.fc\2."),
    (r"^layernorm\.", "norm."),
]


@KEY_LAYOUTS.register("hf-dinov2")
def _hf_dinov2_layout(state: StateDict, encoder: nn.Module) -> StateDict:
    """A transformers Dinov2Model checkpoint (Phikon-v2): separate q/k/v become timm's packed qkv."""
    out: StateDict = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        m = re.match(r"^encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$", key)
        if m:
            qkv.setdefault(f"backbone.blocks.{m[1]}.attn.qkv.{m[3]}", {})[m[2]] = value
            continue
        for pattern, repl in _HF_DINOV2:
            if re.match(pattern, key):
                key = "backbone." + re.sub(pattern, repl, key)
                break
        out[key] = value  # unmatched names stay as they are and are reported as unexpected
    for key, parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            missing = sorted({"query", "key", "value"} - set(parts))
            raise WeightsError(f"attention tensors {key} lack {', '.join(missing)} in the checkpoint")
        out[key] = torch.cat([parts["query"], parts["key"], parts["value"]], dim=0)  # (3D, D) / (3D,)
    return out


@KEY_LAYOUTS.register("swin-v1")
def _swin_v1_layout(state: StateDict, encoder: nn.Module) -> StateDict:
    """The Swin layout of timm < 0.6 (CTransPath): a stage's patch merging moved to the start of the next."""
    out: StateDict = {}
    for key, value in state.items():
        key = re.sub(r"^layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m[1]) + 1}.downsample.", key)
        out[f"backbone.{key}"] = value
    return out


#: CONCH's CoCa vision tower -> ours (both versions name it so; v1 puts it under `visual.`)
_COCA_VISION = (("trunk.", "backbone."), ("attn_pool_contrast.", "pool."), ("ln_contrast.", "pool.norm."))


def _coca_vision_keys(state: StateDict) -> StateDict:
    out: StateDict = {}
    for key, value in state.items():
        for theirs, ours in _COCA_VISION:
            if key.startswith(theirs):
                key = ours + key[len(theirs) :]
                break
        out[key] = value
    return out


@KEY_LAYOUTS.register("conch-v1.5")
def _conch_layout(state: StateDict, encoder: nn.Module) -> StateDict:
    """CONCH v1.5's vision tower (trunk, attn_pool_contrast, ln_contrast); position grid fitted to 448 px."""
    out = _coca_vision_keys(state)
    if "backbone.pos_embed" in out:
        grid = cast(Any, encoder).backbone.patch_embed.grid_size
        out["backbone.pos_embed"] = dino_pos_embed(out["backbone.pos_embed"], grid)
    return out


@KEY_LAYOUTS.register("conch-v1")
def _conch_v1_layout(state: StateDict, encoder: nn.Module) -> StateDict:
    """CONCH v1's CoCa checkpoint (visual.trunk, visual.attn_pool_contrast, visual.ln_contrast; the text
    towers are dropped by the recipe's ignore_keys). A position table of another grid is resampled
    bilinearly as CONCH's coca_model.resize_pos_embed does (mahmoodlab/CONCH 141cc09)."""
    from timm.layers import resample_abs_pos_embed

    out = _coca_vision_keys({key.removeprefix("visual."): value for key, value in state.items()})
    pos = out.get("backbone.pos_embed")
    grid = tuple(cast(Any, encoder).backbone.patch_embed.grid_size)
    if (
        pos is not None
        and pos.shape[1] != 1 + grid[0] * grid[1]
        and math.isqrt(pos.shape[1] - 1) ** 2 == pos.shape[1] - 1
    ):
        out["backbone.pos_embed"] = resample_abs_pos_embed(
            pos, new_size=list(grid), num_prefix_tokens=1, interpolation="bilinear", antialias=False
        )
    return out


def dino_pos_embed(pos: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A (1, 1 + n*n, D) class + square position table at the (H, W) grid the way CONCH's tower does it.

    The published tower keeps a 14 x 14 table (224 px) and interpolates it for every forward pass with
    DINO's recipe: bicubic with scale factors (H + 0.1) / 14, not a target size; a table of another size is
    first resampled to 14 x 14 bilinearly (TRIDENT's resize_pos_embed). Doing that once at load time gives
    the same numbers at the fixed 448 px input.
    """
    from timm.layers import resample_abs_pos_embed

    n = pos.shape[1] - 1
    side = math.isqrt(n)
    if side * side != n:
        return pos  # not a square grid: left for the shape check to report
    if side != 14:
        pos = resample_abs_pos_embed(pos, new_size=(14, 14), num_prefix_tokens=1, antialias=False)
        side = 14
    if tuple(grid) == (side, side):
        return pos
    cls, patches = pos[:, :1], pos[:, 1:]
    dim = pos.shape[-1]
    scale = ((grid[0] + 0.1) / side, (grid[1] + 0.1) / side)
    patches = F.interpolate(
        patches.reshape(1, side, side, dim).permute(0, 3, 1, 2).float(), scale_factor=scale, mode="bicubic"
    )  # (1, D, H, W)
    patches = patches.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos.dtype)
    return torch.cat([cls, patches], dim=1)


# ------------------------------------------------------------------------------------------ checking
def _few(keys: set[str], n: int = 5) -> str:
    items = sorted(keys)
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _ours_to_theirs(key: str) -> str:
    return key.removeprefix("backbone.")


def load_checked(encoder: nn.Module, state: StateDict, recipe: EncoderRecipe, path: Path, name: str) -> None:
    """Load all of `state` into `encoder` or nothing, the recipe's ignored keys left out first."""
    ignore = [re.compile(p) for p in recipe.ignore_keys]
    dropped = sorted(k for k in state if any(p.search(k) for p in ignore))
    if dropped:
        log.info("%s: ignoring %d tensors not part of %s (%s)", path, len(dropped), name, _few(set(dropped)))
    kept = {k: v for k, v in state.items() if k not in set(dropped)}
    given = KEY_LAYOUTS.get(recipe.key_layout)(kept, encoder)
    load_all_or_nothing(
        encoder, given, path=path, what=f"encoder {name!r}", shown=_ours_to_theirs,
        fit_hint="; is it a checkpoint of this architecture?",
    )  # fmt: skip


def load_all_or_nothing(
    model: nn.Module, given: StateDict, *, path: Path, what: str, fit_hint: str = "", hint: str = "",
    shown: Callable[[str], str] = str,
) -> None:  # fmt: skip
    """Load every tensor of `given` (our key names) into `model`, or none: missing, unexpected and
    wrongly shaped tensors are named first, as `shown` spells them (`what`: "encoder 'uni'"; `fit_hint`
    ends the message of a checkpoint that does not fit, `hint` every message)."""
    expected = model.state_dict()
    missing, unexpected = set(expected) - set(given), set(given) - set(expected)
    if missing or unexpected:
        parts = [f"{len(keys)} {why}: {_few({shown(k) for k in keys})}" for keys, why in
                 ((missing, "missing"), (unexpected, "unexpected")) if keys]  # fmt: skip
        raise WeightsError(f"{path} does not fit {what} ({'; '.join(parts)}){fit_hint}{hint}")
    wrong = sorted(k for k in expected if tuple(given[k].shape) != tuple(expected[k].shape))
    if wrong:
        k = wrong[0]
        raise WeightsError(
            f"{path} has tensors of the wrong shape for {what}: {_few({shown(w) for w in wrong})} "
            f"(e.g. {shown(k)}: file {tuple(given[k].shape)}, model {tuple(expected[k].shape)}){hint}"
        )
    model.load_state_dict(given, strict=True)


__all__ = [
    "KEY_LAYOUTS", "dino_pos_embed", "load_all_or_nothing", "load_checked", "load_state_dict_file",
    "located_weights", "resolve_weights_path",
]  # fmt: skip
