"""gdla as the paper defines it (both paths, lambda and lambda', the concatenation fuse; its block with
the pre-mixer SiLU(DWC3x3) and the Mix-FFN of eqs. 29-30) against float64 references written from the
paper's equations (tests/helpers/gdla_reference.py), on a patch grid and on a slide's sparse tile grid, with
padding, chunked, and its pieces; the legacy block of older run records still loads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gdla_reference import ref_block, ref_gdla

from wsi.core.errors import ConfigError
from wsi.models.attention import build_attention
from wsi.models.attention.grid_conv import MixFFN, PreMix
from wsi.models.attention.layout import grid_neighbours, infer_grid_um, tile_layout
from wsi.models.attention.local import depthwise
from wsi.models.layers.transformer import MLP, Block
from wsi.models.presets import build_model, build_model_from_config

DIM, HEADS, INNER = 24, 3, 12


def _gdla(**options: object) -> torch.nn.Module:
    torch.manual_seed(0)
    attn = build_attention("gdla", DIM, HEADS, inner_dim=INNER, **options).double().eval()
    with torch.no_grad():  # every parameter away from its init, lambda and lambda' different
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return attn


def _x(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, DIM, generator=g, dtype=torch.float64) * 2.0 + 0.5


def _holey_slide(seed: int = 4) -> tuple[torch.Tensor, dict[int, tuple[int, int]]]:
    """Tiles on 5 x 7 cells of 256 um with holes, shuffled, offset from the origin: (N, 2) um, cells."""
    g = torch.Generator().manual_seed(seed)
    cells = [(r, c) for r in range(5) for c in range(7) if torch.rand(1, generator=g) > 0.3]
    perm = torch.randperm(len(cells), generator=g).tolist()
    cells = [cells[i] for i in perm]
    coords = torch.tensor([[c * 256.0 + 1000.5, r * 256.0 + 3000.25] for r, c in cells], dtype=torch.float64)
    return coords, dict(enumerate(cells))


def test_both_paths_match_the_reference_on_a_patch_grid_behind_a_class_token() -> None:
    attn, x = _gdla(), _x(1 + 4 * 5)
    cells = {1 + r * 5 + c: (r, c) for r in range(4) for c in range(5)}  # token 0: class token
    with torch.no_grad():
        got = attn(x, grid_shape=(4, 5))[0]
        want = ref_gdla(attn, x[0], cells)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    assert attn.to_out.weight.shape == (DIM, 2 * INNER)  # the 2D x D' fuse of the two paths
    assert not torch.equal(attn.lam, attn.lam_local)


def test_both_paths_match_the_reference_on_a_sparse_slide_grid() -> None:
    coords, cells = _holey_slide()
    attn, x = _gdla(), _x(len(cells))
    table = tile_layout(coords[None]).in_token_order()  # pitch read off the coordinates: 256 um
    with torch.no_grad():
        got = attn(x, neighbours=table)[0]
        want = ref_gdla(attn, x[0], cells)
        alone = ref_gdla(attn, x[0], None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    assert (got - alone).abs().max() > 1e-3  # the neighbours matter
    assert infer_grid_um(coords) == 256.0


def test_padding_changes_nothing_on_a_sparse_grid() -> None:
    """Two bags padded with garbage in one batch: each real token's output equals its bag's reference."""
    bags = [_holey_slide(seed) for seed in (4, 5)]
    n = max(len(c) for c, _ in bags)
    attn = _gdla()
    x = _x(n, batch=2)
    coords = torch.zeros(2, n, 2, dtype=torch.float64)
    mask = torch.zeros(2, n, dtype=torch.bool)
    for i, (c, _) in enumerate(bags):
        coords[i, : len(c)], mask[i, : len(c)] = c, True
        x[i, len(c) :] = 1e3
        coords[i, len(c) :] = 256.0  # padding at real cells must not become anyone's neighbour
    table = tile_layout(coords, mask).in_token_order()
    with torch.no_grad():
        got = attn(x, mask, neighbours=table)
        for i, (c, cells) in enumerate(bags):
            want = ref_gdla(attn, x[i, : len(c)], cells)
            torch.testing.assert_close(got[i, : len(c)], want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("block", ["paper", "legacy"])
def test_chunked_mil_equals_the_plain_pass_on_a_sparse_grid(block: str) -> None:
    """The paper's block convolves the grid three times per block (pre-mixer, local path, Mix-FFN):
    the chunked scheme's halo passes (models.chunked._grid_block) give the plain pass's logits."""
    torch.manual_seed(0)
    m = build_model(
        "vit-wsi", attention="gdla", in_dim=20, dim=32, attn_dim=16, heads=4, mlp_dim=48, gdla_block=block
    ).eval()
    coords = torch.cat([_holey_slide(4)[0], _holey_slide(6)[0] + 5 * 256])[None].float()  # two pieces
    x = torch.randn(1, coords.shape[1], 20)
    perm = torch.randperm(coords.shape[1])
    with torch.no_grad():
        plain = m(x, coords_um=coords)
        for chunk in (3, 8, 1000):  # chunks smaller than a grid row: outputs wait for later neighbours
            torch.testing.assert_close(
                m(x, coords_um=coords, max_tokens_per_chunk=chunk), plain, rtol=0, atol=1e-5
            )
        torch.testing.assert_close(m(x[:, perm], coords_um=coords[:, perm]), plain, rtol=0, atol=1e-5)
        assert (m(x) - plain).abs().max() > 1e-4  # coordinates matter; without them tiles are alone


def test_slide_bags_get_the_local_path_and_vit3d_a_3d_kernel() -> None:
    mil = build_model("vit-wsi", attention="gdla", attention_options={"local": True}, depth=1)
    assert mil.transformer.blocks[0].attn.dwc_weight.shape == (4 * 512, 9)
    v3 = build_model("vit-3d", attention="gdla", depth=1, dim=32, attn_dim=16, heads=4, mlp_dim=32)
    assert v3.transformer.blocks[0].attn.dwc_weight.shape == (4 * 16, 27)
    off = build_model("vit-wsi", attention="gdla", attention_options={"local": False}, depth=1)
    assert off.transformer.blocks[0].attn.to_out.weight.shape == (512, 512)  # global path alone


def test_sparse_depthwise_equals_a_zero_padded_conv_and_has_exact_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, 12, 5, generator=g, dtype=torch.float64, requires_grad=True)  # 3 x 4 grid
    w = torch.randn(5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    table = grid_neighbours((3, 4), 12)
    got = depthwise(u, table, w, centre=4)
    conv = F.conv2d(u.transpose(1, 2).reshape(2, 5, 3, 4), w.view(5, 1, 3, 3), padding=1, groups=5)
    torch.testing.assert_close(got, conv.flatten(2).transpose(1, 2), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: depthwise(a, table, b, centre=4), (u, w))
    with pytest.raises(ConfigError, match="grid_ndim"):
        depthwise(u, table, torch.ones(5, 27, dtype=torch.float64), centre=13)


def test_tile_layout_orders_by_grid_rows_and_finds_neighbours() -> None:
    coords = torch.tensor([[[512.0, 0.0], [0.0, 0.0], [256.0, 256.0], [0.0, 256.0], [9.0, 9.0]]])
    mask = torch.tensor([[True, True, True, True, False]])
    layout = tile_layout(coords, mask, grid_um=256.0)
    assert layout.order.tolist() == [[1, 0, 3, 2, 4]]  # row 0 left to right, then row 1, padding last
    table = layout.in_token_order()[0]
    # token 1 at (x 0, y 0): right neighbour none (512 is two cells away), below token 3, diagonal token 2
    assert table[1].tolist() == [-1, -1, -1, -1, 1, -1, -1, 3, 2]
    assert table[4].tolist() == [-1, -1, -1, -1, 4, -1, -1, -1, -1]  # padding: alone
    with pytest.raises(ConfigError, match="grid_um"):
        tile_layout(coords, mask, grid_um=-1.0)


def test_contributions_add_up_with_the_local_path_on_a_slide_grid() -> None:
    torch.manual_seed(0)
    m = build_model("vit-wsi", attention="gdla", in_dim=20, dim=32, attn_dim=16, heads=4, mlp_dim=48).eval()
    coords, _ = _holey_slide()
    x = torch.randn(1, coords.shape[0], 20)
    with torch.no_grad():
        contrib, base = m.logit_decomposition(x, coords_um=coords[None].float())
        logits = m(x, coords_um=coords[None].float())
    torch.testing.assert_close(base + contrib.sum(1), logits, rtol=0, atol=1e-5)
    assert contrib.abs().amax() > 1e-4


def test_a_padded_batch_of_slides_runs_chunked_like_each_slide_alone() -> None:
    torch.manual_seed(0)
    m = build_model("vit-wsi", attention="gdla", in_dim=20, dim=32, attn_dim=16, heads=4, mlp_dim=48).eval()
    slides = [_holey_slide(4)[0].float(), _holey_slide(7)[0].float()]
    n = max(len(c) for c in slides)
    coords, mask = torch.zeros(2, n, 2), torch.zeros(2, n, dtype=torch.bool)
    x = torch.full((2, n, 20), float("nan"))  # NaN padding must reach nothing
    for i, c in enumerate(slides):
        coords[i, : len(c)], mask[i, : len(c)], x[i, : len(c)] = c, True, torch.randn(len(c), 20)
    with torch.no_grad():
        alone = torch.cat([m(x[i : i + 1, : len(c)], coords_um=c[None]) for i, c in enumerate(slides)])
        for chunk in (3, 7, 100):
            torch.testing.assert_close(
                m(x, mask, coords, max_tokens_per_chunk=chunk), alone, rtol=0, atol=1e-5
            )


def _paper_block() -> Block:
    torch.manual_seed(0)
    blk = Block(DIM, HEADS, 20, attention="gdla", attn_dim=INNER, paper_block=True).double().eval()
    with torch.no_grad():  # every parameter away from its init
        for p in blk.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return blk


@pytest.mark.parametrize("grid", ["patch", "slide"])
def test_the_paper_block_matches_its_equations(grid: str) -> None:
    """Figure 2 + eqs. 15-28 (mixer) + eqs. 29-30 (Mix-FFN), in float64, on a patch grid behind a class
    token and on a slide's sparse grid (empty cells read zero)."""
    blk = _paper_block()
    assert isinstance(blk.pre, PreMix) and isinstance(blk.mlp, MixFFN)
    assert blk.mlp.pwc1.weight.shape == (2 * 20, DIM) and blk.mlp.pwc2.bias is None  # eq. 29: 2 d_hidden
    if grid == "patch":
        x = _x(1 + 4 * 5)
        cells = {1 + r * 5 + c: (r, c) for r in range(4) for c in range(5)}
        table = grid_neighbours((4, 5), x.shape[1])
    else:
        coords, cells = _holey_slide()
        x = _x(len(cells))
        table = tile_layout(coords[None]).in_token_order()
    with torch.no_grad():
        got = blk(x, None, table)[0]
        want = ref_block(blk, x[0], cells)
        no_grid = ref_block(blk, x[0], None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    assert (want - no_grid).abs().max() > 1e-2  # the grid convolutions read the neighbours


def test_lambda_starts_as_the_released_code_draws_it_and_legacy_keeps_its_block() -> None:
    """lambda, lambda' ~ N(0, 0.1) (xmindflow/gdla @973d374 modules/attn/gdla.py); `gdla_block: legacy`
    is the block before issue 22 (LayerNorm -> mixer, plain MLP, lambda = 0.5)."""
    torch.manual_seed(0)
    m = build_model("vit-wsi", attention="gdla", in_dim=20, dim=64, attn_dim=64, heads=4, mlp_dim=32, depth=2)
    layers = m.transformer.layers()
    lam = torch.cat([torch.cat([b.attn.lam, b.attn.lam_local]).flatten() for b in layers]).detach()
    assert abs(float(lam.mean())) < 0.02 and 0.08 < float(lam.std()) < 0.12
    assert m.to_dict()["gdla_block"] == "paper"
    legacy = build_model(
        "vit-wsi", attention="gdla", in_dim=20, dim=32, attn_dim=16, heads=4, mlp_dim=48, gdla_block="legacy"
    ).eval()
    blk = legacy.transformer.layers()[0]
    assert blk.pre is None and isinstance(blk.mlp, MLP) and bool((blk.attn.lam == 0.5).all())
    # a run record written before the field existed: rebuilt with the legacy block, its weights load
    old = {k: v for k, v in legacy.to_dict().items() if k != "gdla_block"}
    again = build_model_from_config(old, saved=True).eval()
    again.load_state_dict(legacy.state_dict())
    x, coords = torch.randn(1, 12, 20), _holey_slide()[0][:12][None].float()
    with torch.no_grad():
        torch.testing.assert_close(again(x, coords_um=coords), legacy(x, coords_um=coords), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=r"pre\.dwc"):  # without `saved` it is today's block
        build_model_from_config(old).load_state_dict(legacy.state_dict())
