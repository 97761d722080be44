"""The text towers against their authors' code (tests/helpers/text_towers_reference.py), on random weights
saved under the published checkpoints' names, with the tokenizers run as the authors run them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from text_towers_reference import (
    RefClipModelText,
    RefCocaText,
    RefPrism,
    coca_encode_text,
    conch_tokenize,
    randomise,
    zero_shot_classifier,
)

from wsi.core.errors import WeightsError
from wsi.models.text_encoders import TEXT_ENCODERS, build_text_encoder, get_spec
from wsi.models.text_encoders.biogpt import BioGptConfig
from wsi.models.text_encoders.clip import ClipTextConfig
from wsi.models.text_encoders.coca import CocaTextConfig

PROMPTS = [
    "lung adenocarcinoma.",
    "an H&E image of squamous cell carcinoma of the lung.",
    "Tumour-infiltrating lymphocytes",
    "a histopathological photograph showing necrosis, H&E stain.",
]
CORPUS = (
    PROMPTS
    + [
        "adenocarcinoma of the lung",
        "lung squamous cell carcinoma",
        "a photomicrograph of normal tissue",
        "invasive ductal carcinoma of the breast",
        "mucinous adenocarcinoma with signet ring cells",
    ]
    * 5
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def conch_style_tokenizer(path: Path) -> Path:
    """A tokenizer.json laid out as CONCH's conch_byte_level_bpe_uncased.json (NFD, StripAccents, Lowercase;
    ByteLevel with a prefix space; BPE; <start_of_text> $A <end_of_text>), trained here on a small corpus."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<start_of_text>", "<end_of_text>", "<|person|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<start_of_text> $A <end_of_text>",
        special_tokens=[("<start_of_text>", 1), ("<end_of_text>", 2)],
    )
    tok.save(str(path))
    return path


def tiny_coca(vocab: int, *, titan: bool) -> tuple[CocaTextConfig, RefCocaText]:
    cfg = CocaTextConfig(
        vocab_size=vocab,
        width=32,
        heads=4,
        layers=2,
        output_dim=24 if titan else 16,
        num_pos=129 if titan else 128,
    )
    ref = RefCocaText(vocab=vocab, width=32, heads=4, layers=2, output_dim=cfg.output_dim, open_clip_v2=titan)
    return cfg, randomise(ref)


@pytest.fixture(scope="module")
def conch_tok(tmp_path_factory) -> Path:
    return conch_style_tokenizer(tmp_path_factory.mktemp("tok") / "conch_byte_level_bpe_uncased.json")


def test_conch_tokens_are_the_authors(conch_tok: Path) -> None:
    from tokenizers import Tokenizer

    cfg, _ = tiny_coca(400, titan=False)
    tower = build_text_encoder("conch-v1", random_init=True, tokenizer=conch_tok, config=cfg)
    long = " ".join(["adenocarcinoma"] * 200)
    got = tower.tokenize([*PROMPTS, long]).ids
    want = conch_tokenize(Tokenizer.from_file(str(conch_tok)), [*PROMPTS, long])
    assert got.shape == (5, 128) and torch.equal(got, want)
    assert got[0, 0] == 1 and (got[0] == 2).sum() == 1 and got[0, -1] == 0  # <start>, one <end>, <pad> slot
    assert got[4, 126] == 2 and got[4, 127] == 0  # truncated to 127: <end> kept, then the <cls> slot


def test_conch_v1_equals_the_authors_text_tower(tmp_path: Path, conch_tok: Path) -> None:
    cfg, ref = tiny_coca(400, titan=False)
    proj = torch.randn(16, 16)
    state = {f"text.{k}": v for k, v in ref.state_dict().items()}
    state |= {
        "visual.proj_contrast": proj,
        "logit_scale": torch.tensor(4.2),
        "visual.trunk.cls_token": torch.zeros(1, 1, 8),
        "text_decoder.ln_final.weight": torch.ones(8),
    }
    torch.save(state, tmp_path / "pytorch_model.bin")  # huggingface.co/MahmoodLab/CONCH layout
    (tmp_path / "conch_byte_level_bpe_uncased.json").write_bytes(conch_tok.read_bytes())
    tower = build_text_encoder("conch-v1", weights=tmp_path, config=cfg)
    from tokenizers import Tokenizer

    with torch.no_grad():
        want = coca_encode_text(ref, conch_tokenize(Tokenizer.from_file(str(conch_tok)), PROMPTS))
    got = tower.encode_text(PROMPTS)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert tower.logit_scale() == pytest.approx(float(torch.tensor(4.2).exp()))
    feats = torch.randn(5, 16)  # ln_contrast(pooled), as conch-v1 bags hold it
    torch.testing.assert_close(tower.image_to_joint(feats), F.normalize(feats @ proj, dim=-1))
    # the authors' ensemble (zero_shot_classifier) from our prompt embeddings
    classes = [["adenocarcinoma", "LUAD"], ["squamous cell carcinoma"]]
    templates = ["CLASSNAME.", "an image of CLASSNAME."]
    with torch.no_grad():
        ref_cls = zero_shot_classifier(
            lambda t: coca_encode_text(ref, conch_tokenize(Tokenizer.from_file(str(conch_tok)), t)),
            classes,
            templates,
        )
    from wsi.pipelines.zero_shot.prompts import PromptSet, class_embeddings

    ours = class_embeddings(
        tower, PromptSet.from_classes({"LUAD": classes[0], "LUSC": classes[1]}, templates)
    )
    torch.testing.assert_close(ours.T, ref_cls, atol=2e-5, rtol=1e-4)


def test_titan_equals_open_clip_text_tower(tmp_path: Path, conch_tok: Path) -> None:
    cfg, ref = tiny_coca(400, titan=True)
    proj = torch.randn(24, 24)
    state = {f"text_encoder.{k}": v for k, v in ref.state_dict().items()}
    state |= {"vision_encoder.proj": proj, "vision_encoder.cls_token": torch.zeros(1, 1, 24)}
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "tokenizer.json").write_bytes(conch_tok.read_bytes())
    tower = build_text_encoder("titan", weights=tmp_path / "model.safetensors", config=cfg)
    from tokenizers import Tokenizer

    with torch.no_grad():
        want = coca_encode_text(ref, conch_tokenize(Tokenizer.from_file(str(conch_tok)), PROMPTS))
    torch.testing.assert_close(tower.encode_text(PROMPTS), want, atol=2e-5, rtol=1e-4)
    slide = torch.randn(3, 24)
    torch.testing.assert_close(tower.image_to_joint(slide), F.normalize(slide @ proj, dim=-1))
    assert tower.logit_scale() == 1.0  # modeling_titan.zero_shot: no temperature


def _clip_files(folder: Path) -> None:
    """vocab.json + merges.txt as openai/clip-vit-base-patch32 (and vinid/plip) publish them, from the BPE
    file open_clip ships (OpenAI's bpe_simple_vocab_16e6)."""
    import json

    from open_clip.tokenizer import SimpleTokenizer

    st = SimpleTokenizer()
    folder.mkdir(parents=True, exist_ok=True)
    names = {
        "<start_of_text>": "<|startoftext|>",
        "<end_of_text>": "<|endoftext|>",
    }  # open_clip renamed OpenAI's
    vocab = {names.get(k, k): v for k, v in st.encoder.items()}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = sorted(st.bpe_ranks, key=st.bpe_ranks.get)
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n", encoding="utf-8"
    )


def test_plip_tokens_and_text_tower(tmp_path: Path) -> None:
    from open_clip import tokenize as openai_tokenize

    ref = randomise(RefClipModelText(width=32, heads=4, layers=2, inner=64, out=16))
    state = {k: v for k, v in ref.state_dict().items()}
    state["text_model.embeddings.position_ids"] = torch.arange(77)[None]  # saved by older transformers
    state["vision_model.post_layernorm.weight"] = torch.ones(8)
    state["visual_projection.weight"] = torch.zeros(16, 8)
    torch.save(state, tmp_path / "pytorch_model.bin")
    _clip_files(tmp_path)
    cfg = ClipTextConfig(width=32, heads=4, layers=2, intermediate=64, output_dim=16)
    tower = build_text_encoder("plip", weights=tmp_path, config=cfg)
    long = " ".join(["carcinoma"] * 100)
    ids = tower.tokenize([*PROMPTS, long]).ids
    openai = openai_tokenize([*PROMPTS, long])  # OpenAI's tokenizer: ftfy, whitespace, lower case, BPE
    eot = 49407
    for got, want in zip(ids, openai, strict=True):
        n = int((want == eot).nonzero()[0]) + 1
        assert (
            torch.equal(got[:n], want[:n]) and (got[n:] == eot).all()
        )  # CLIPProcessor pads with <|endoftext|>
    mask = (torch.arange(77)[None] <= ids.argmax(-1)[:, None]).long()  # the processor's attention_mask
    with torch.no_grad():
        want = F.normalize(ref.get_text_features(ids, mask), dim=-1)
    torch.testing.assert_close(tower.encode_text([*PROMPTS, long]), want, atol=2e-5, rtol=1e-4)
    assert tower.logit_scale() == pytest.approx(float(ref.logit_scale.detach().exp()))


def _biogpt_files(folder: Path) -> None:
    """A small BioGPT-layout vocabulary: <s> <pad> </s> <unk>, characters, a few merges ('a b count')."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    merges = [
        ("l", "u"),
        ("lu", "n"),
        ("lun", "g</w>"),
        ("c", "a"),
        ("ca", "r"),
        ("-", "@</w>"),
        ("@", "-@</w>"),
    ]
    chars = sorted({c for text in CORPUS for c in text.lower() + text.upper()} | set("&;@-"))
    vocab = (
        ["<s>", "<pad>", "</s>", "<unk>"]
        + [c for c in chars if c.strip()]
        + [c + "</w>" for c in chars if c.strip()]
    )
    vocab += ["".join(m) for m in merges]
    (folder / "vocab.json").write_text(
        json.dumps({t: i for i, t in enumerate(dict.fromkeys(vocab))}), encoding="utf-8"
    )
    (folder / "merges.txt").write_text(
        "\n".join(f"{a} {b} {100 - i}" for i, (a, b) in enumerate(merges)) + "\n", encoding="utf-8"
    )


def test_biogpt_tokens(tmp_path: Path) -> None:
    import json

    _biogpt_files(tmp_path)
    from wsi.models.text_encoders.text_tokens import BioGptTokenizer

    tok = BioGptTokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    out = tok(["lung", "non-small H&E"]).ids
    # '</s>' + BPE(Moses(text)) + '</s>', padded with <pad> (1) to the longest prompt
    assert out[0].tolist()[:3] == [2, vocab["lung</w>"], 2] and set(out[0].tolist()[3:]) == {1}
    # Moses: aggressive dash split ('non @-@ small'), XML escape ('&' -> '&amp;')
    words = tok.moses.tokenize("non-small H&E", aggressive_dash_splits=True, return_str=False, escape=True)
    assert words == ["non", "@-@", "small", "H", "&amp;", "E"]
    assert out[1, 4] == vocab["@-@</w>"] and out[1, -1] == 2
    # the whole row, each word's BPE pieces by hand: 'non' '@-@' 'small' 'H' '&amp;' 'E' between </s>
    pieces = ["n", "o", "n</w>", "@-@</w>", "s", "m", "a", "l", "l</w>", "H</w>", "&", "a", "m", "p", ";</w>"]
    assert out[1].tolist() == [2, *(vocab[p] for p in [*pieces, "E</w>"]), 2]


def test_prism_equals_the_authors_text_side(tmp_path: Path) -> None:
    _biogpt_files(tmp_path / "biogpt")
    vocab = 130  # above the small vocabulary's ids; the last is PRISM's <cls>
    ref = randomise(
        RefPrism(
            vocab=vocab,
            width=32,
            heads=4,
            layers=4,
            inner=64,
            positions=64,
            latents=24,
            image_dim=16,
            cls_id=vocab - 1,
        )
    )
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    cfg = BioGptConfig(
        vocab_size=vocab,
        width=32,
        heads=4,
        layers=4,
        intermediate=64,
        max_positions=64,
        latent_dim=24,
        image_dim=16,
        cls_id=vocab - 1,
    )
    tower = build_text_encoder("prism", weights=tmp_path, config=cfg)
    prompts = ["lung carcinoma", "car", "lung", "non-small lung carcinoma of the lung"]
    tokens = tower.tokenize(prompts)
    with torch.no_grad():
        want = F.normalize(ref.text_to_latents.to_latents(ref.text_embedding(tokens.ids[:, :-1])), dim=-1)
    torch.testing.assert_close(tower.encode_text(prompts), want, atol=2e-5, rtol=1e-4)
    slide = torch.randn(2, 16)
    torch.testing.assert_close(
        tower.image_to_joint(slide), F.normalize(ref.img_to_latents.to_latents(slide), dim=-1)
    )
    assert tower.logit_scale() == pytest.approx(float(ref.temperature.detach().exp()))


def test_wrong_checkpoints_are_named(tmp_path: Path) -> None:
    cfg, ref = tiny_coca(400, titan=False)
    state = {f"text.{k}": v for k, v in ref.state_dict().items() if "ln_final" not in k}
    state["visual.proj_contrast"] = torch.randn(16, 16)
    state["logit_scale"] = torch.tensor(1.0)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(WeightsError, match=r"2 missing: ln_final\.bias, ln_final\.weight"):
        build_text_encoder("conch-v1", weights=tmp_path, config=cfg, tokenizer=tmp_path)
    state = {f"text.{k}": v for k, v in ref.state_dict().items()} | {
        "visual.proj_contrast": torch.randn(16, 16),
        "logit_scale": torch.tensor(1.0),
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(
        WeightsError, match=r"CONCH's tokenizer conch_byte_level_bpe_uncased\.json was not found"
    ):
        build_text_encoder("conch-v1", weights=tmp_path, config=cfg)


def test_published_sizes() -> None:
    """The full-size towers have the authors' parameter counts (meta device: nothing allocated)."""
    with torch.device("meta"):
        ours = {n: sum(p.numel() for p in TEXT_ENCODERS.get(n)().parameters()) for n in TEXT_ENCODERS.names()}
        conch = (
            sum(p.numel() for p in RefCocaText().parameters()) + 512 * 512 + 1
        )  # + proj_contrast, logit_scale
        titan = (
            sum(p.numel() for p in RefCocaText(output_dim=768, open_clip_v2=True).parameters()) + 768 * 768
        )
        plip = sum(p.numel() for p in RefClipModelText().parameters())
        prism_ref = RefPrism()
        bio = prism_ref.text_decoder.model.biogpt
        prism = (
            sum(p.numel() for layer in bio.layers[:12] for p in layer.parameters())
            + bio.embed_tokens.weight.numel()
            + bio.embed_positions.weight.numel()
            + 2 * 0
            + prism_ref.text_to_latents.to_latents.weight.numel()
            + prism_ref.img_to_latents.to_latents.weight.numel()
            + 1
        )
    assert ours == {"conch-v1": conch, "titan": titan, "plip": plip, "prism": prism}
    assert get_spec("conch-v1").image_encoders == ("conch-v1",) and get_spec("titan").level == "slide"
