"""Image readers, transforms and augmentation: the real files in ../shared/data, small synthetic ones."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from wsi.core.errors import ImageReadError
from wsi.pipelines.inputs.clinical.augment import apply_2d, augment_2d, augment_3d, draw_2d, draw_3d
from wsi.pipelines.inputs.clinical.readers import MissingReaderError, read_image
from wsi.pipelines.inputs.clinical.transforms import ImageSpec, center_crop_or_pad, prepare

pydicom = pytest.importorskip("pydicom")
nib = pytest.importorskip("nibabel")

CXR_DCM = "cxr/1.2.276.0.7230010.3.1.4.8323329.6904.1517875201.850819.dcm"


# --- photos ---------------------------------------------------------------------------------------


def test_png_radiograph_gray_rows_first(shared_data: Path) -> None:
    path = shared_data / "cxr" / "00000001_000.png"
    img = read_image(path)
    assert img.pixels.shape == (512, 512, 1) and img.pixels.dtype == np.float32
    assert img.value_range == (0.0, 1.0)
    assert img.pixels.min() >= 0.0 and img.pixels.max() <= 1.0
    with Image.open(path) as pil:
        for x, y in [(10, 400), (300, 20), (511, 0)]:  # (column, row): the array is [row, column]
            assert img.pixels[y, x, 0] == pytest.approx(pil.getpixel((x, y)) / 255.0)


def test_jpeg_dermoscopy_rgb_landscape(shared_data: Path) -> None:
    img = read_image(shared_data / "derm" / "ISIC_0024311.jpg")
    assert img.pixels.shape == (450, 600, 3)  # 600 wide, 450 high: not transposed
    assert img.pixels.min() >= 0.0 and img.pixels.max() <= 1.0


def test_fundus_channels_are_rgb(shared_data: Path) -> None:
    img = read_image(shared_data / "fundus" / "retina.jpg")
    assert img.pixels.shape == (1411, 1411, 3)
    red, green, blue = img.pixels.reshape(-1, 3).mean(axis=0)
    assert red > green > blue  # a retina is red; BGR order would invert this


def test_jpeg_exif_rotation_applied(shared_data: Path, tmp_path: Path) -> None:
    with Image.open(shared_data / "derm" / "ISIC_0027001.jpg") as pil:
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
        pil.save(tmp_path / "rot.jpg", exif=exif, quality=95)
    with Image.open(tmp_path / "rot.jpg") as raw:
        stored = np.asarray(raw, dtype=np.float32) / 255.0  # (450, 600, 3) as stored
    img = read_image(tmp_path / "rot.jpg")
    assert img.pixels.shape == (600, 450, 3)
    np.testing.assert_array_equal(img.pixels, np.rot90(stored, k=-1))


# --- DICOM ----------------------------------------------------------------------------------------


def test_dicom_radiograph_raw_scale_and_spacing(shared_data: Path) -> None:
    img = read_image(shared_data / CXR_DCM)
    assert img.pixels.shape == (1024, 1024, 1)
    assert img.value_range == (0.0, 255.0)  # 8 stored bits, no rescale, no window
    assert img.pixels.min() >= 0 and img.pixels.max() <= 255 and img.pixels.max() > 200
    assert img.spacing_mm == pytest.approx((0.168, 0.168))
    raw = pydicom.dcmread(shared_data / CXR_DCM).pixel_array
    np.testing.assert_array_equal(img.pixels[..., 0], raw.astype(np.float32))


def test_dicom_monochrome1_is_inverted(shared_data: Path, tmp_path: Path) -> None:
    ds = pydicom.dcmread(shared_data / CXR_DCM)
    assert ds.PhotometricInterpretation == "MONOCHROME2"
    ds.PhotometricInterpretation = "MONOCHROME1"
    ds.save_as(tmp_path / "mono1.dcm")
    normal = read_image(shared_data / CXR_DCM).pixels
    inverted = read_image(tmp_path / "mono1.dcm").pixels
    np.testing.assert_array_equal(inverted, 255.0 - normal)


def test_dicom_window_rescale_and_inverted_window(shared_data: Path, tmp_path: Path) -> None:
    path = shared_data / "mri" / "MR_small.dcm"
    ds = pydicom.dcmread(path)
    raw = ds.pixel_array.astype(np.float64)
    img = read_image(path)
    assert img.pixels.shape == (64, 64, 1) and img.value_range == (0.0, 1.0)
    center, width = float(ds.WindowCenter), float(ds.WindowWidth)  # 600, 1600
    expected = np.clip((raw - (center - 0.5)) / (width - 1) + 0.5, 0, 1)
    np.testing.assert_allclose(img.pixels[..., 0], expected, atol=1e-6)

    ds.PhotometricInterpretation = "MONOCHROME1"
    ds.save_as(tmp_path / "mono1.dcm")
    np.testing.assert_allclose(read_image(tmp_path / "mono1.dcm").pixels, 1.0 - img.pixels, atol=1e-6)

    ds = pydicom.dcmread(path)
    del ds.WindowCenter, ds.WindowWidth
    ds.RescaleSlope, ds.RescaleIntercept = 2, -1024  # e.g. CT: stored values -> Hounsfield units
    ds.save_as(tmp_path / "rescaled.dcm")
    rescaled = read_image(tmp_path / "rescaled.dcm")
    np.testing.assert_allclose(rescaled.pixels[..., 0], 2 * raw - 1024)
    # the data (127..2145 stored) fills ~3% of the signed 16-bit range: scaled by the data, not the bits
    assert rescaled.value_range is None


def test_unwindowed_dicom_fills_the_model_input_range(shared_data: Path, tmp_path: Path) -> None:
    """MR_small without its window: scaling by -32768..32767 gave a flat input in [0.004, 0.065]."""
    ds = pydicom.dcmread(shared_data / "mri" / "MR_small.dcm")
    del ds.WindowCenter, ds.WindowWidth
    ds.save_as(tmp_path / "nowindow.dcm")
    img = read_image(tmp_path / "nowindow.dcm")
    assert img.value_range is None
    x = prepare(img, ImageSpec(size_px=(64, 64), channels=1, normalize="range"))
    assert x.min() >= -1 and x.max() <= 1 and float(x.max() - x.min()) > 1.5
    windowed = prepare(read_image(shared_data / "mri" / "MR_small.dcm"), ImageSpec((64, 64), 1, "range"))
    assert float(windowed.max() - windowed.min()) > 1.5  # the file's own window also spans the range


def test_missing_pydicom_names_the_extra(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydicom", None)  # import pydicom now raises ImportError
    with pytest.raises(MissingReaderError, match=r"pip install 'wsi\[images\]'"):
        read_image(shared_data / "mri" / "MR_small.dcm")


# --- NIfTI and npy ----------------------------------------------------------------------------------


def test_nifti_volume_shape_spacing(shared_data: Path) -> None:
    img = read_image(shared_data / "mri" / "example4d.nii.gz", spatial_dims=3)
    # 128x96x24 voxels x 2 volumes -> (slices, rows, columns, channels)
    assert img.pixels.shape == (24, 96, 128, 2)
    assert img.spacing_mm == pytest.approx((2.2, 2.0, 2.0), abs=1e-5)
    assert img.value_range is None and img.pixels.min() >= 0 and img.pixels.max() > 100


def test_nifti_orientation_follows_the_affine(tmp_path: Path) -> None:
    data = np.zeros((10, 8, 6), np.float32)  # (i, j, k)
    data[1, 2, 3] = 1.0
    affine = np.diag([-2.0, 3.0, 4.0, 1.0])  # i runs to the patient's left, j anterior, k superior
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "v.nii.gz")
    img = read_image(tmp_path / "v.nii.gz", spatial_dims=3)
    assert img.pixels.shape == (6, 8, 10, 1)  # (S, P, L)
    assert img.spacing_mm == pytest.approx((4.0, 3.0, 2.0))
    # slice k=3 (inferior->superior); row: anterior first -> 7-2; column: patient right first -> i=1
    assert np.argwhere(img.pixels[..., 0] == 1.0).tolist() == [[3, 5, 1]]


def test_npy_layouts_and_no_pickles(tmp_path: Path) -> None:
    np.save(tmp_path / "gray.npy", np.arange(12, dtype=np.int16).reshape(3, 4))
    gray = read_image(tmp_path / "gray.npy")
    assert gray.pixels.shape == (3, 4, 1) and gray.pixels[2, 3, 0] == 11
    np.save(tmp_path / "rgb.npy", np.full((5, 6, 3), 255, np.uint8))
    rgb = read_image(tmp_path / "rgb.npy")
    assert rgb.pixels.shape == (5, 6, 3) and rgb.pixels.max() == 1.0 and rgb.value_range == (0.0, 1.0)
    np.save(tmp_path / "vol.npy", np.zeros((4, 5, 6), np.float32))
    assert read_image(tmp_path / "vol.npy", spatial_dims=3).pixels.shape == (4, 5, 6, 1)
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ImageReadError, match=r"evil\.npy"):
        read_image(tmp_path / "evil.npy")


def test_volume_refused_for_2d_task(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ImageReadError, match="24 slices"):
        read_image(shared_data / "mri" / "example4d.nii.gz", spatial_dims=2)
    np.save(tmp_path / "vol.npy", np.random.default_rng(0).random((32, 256, 256), np.float32))  # (D, H, W)
    with pytest.raises(ImageReadError, match=r"vol\.npy.*looks like a volume \(D, H, W\).*3D task"):
        read_image(tmp_path / "vol.npy", spatial_dims=2)  # was read as 256 channels and averaged
    assert read_image(tmp_path / "vol.npy", spatial_dims=3).pixels.shape == (32, 256, 256, 1)
    np.save(tmp_path / "rgba.npy", np.zeros((8, 8, 4), np.float32))  # up to 4 channels is still 2D
    assert read_image(tmp_path / "rgba.npy").pixels.shape == (8, 8, 4)


@pytest.mark.parametrize("name", ["bad.png", "bad.jpg", "bad.dcm", "bad.nii.gz", "bad.npy"])
def test_garbage_files_raise_naming_the_path(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"\x00not an image at all" * 20)
    with pytest.raises(ImageReadError, match=name.replace(".", r"\.")):
        read_image(tmp_path / name)


def test_truncated_jpeg_raises(shared_data: Path, tmp_path: Path) -> None:
    data = (shared_data / "derm" / "ISIC_0027287.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 3])
    with pytest.raises(ImageReadError, match=r"cut\.jpg"):
        read_image(tmp_path / "cut.jpg")


# --- transforms -----------------------------------------------------------------------------------


def test_prepare_2d_channels_and_scale(shared_data: Path) -> None:
    derm = read_image(shared_data / "derm" / "ISIC_0024311.jpg")
    x = prepare(derm, ImageSpec(size_px=(224, 224), channels=3, normalize="imagenet"))
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32
    # ImageNet scaling of [0, 1] values stays within [-0.485/0.229, (1-0.406)/0.225]
    assert x.min() >= -2.2 and x.max() <= 2.7
    gray = prepare(derm, ImageSpec(size_px=(64, 96), channels=1, normalize="range"))
    assert gray.shape == (1, 64, 96) and gray.min() >= -1 and gray.max() <= 1
    cxr = prepare(read_image(shared_data / "cxr" / "00000001_000.png"), ImageSpec((32, 32), 3, "range"))
    assert cxr.shape == (3, 32, 32) and torch.equal(cxr[0], cxr[2])  # gray repeated


def test_prepare_3d_resamples_to_spacing_then_crops(shared_data: Path) -> None:
    vol = read_image(shared_data / "mri" / "example4d.nii.gz", spatial_dims=3)  # (24, 96, 128) at 2.2/2/2 mm
    spec = ImageSpec(size_px=(16, 64, 48), channels=1, normalize="zscore", spacing_mm=(4.4, 4.0, 4.0))
    x = prepare(vol, spec)  # resampled to (12, 48, 64), then D and H padded, W cropped
    assert x.shape == (1, 16, 64, 48)
    assert torch.all(x[:, :2] == 0) and torch.all(x[:, -2:] == 0)  # 2 padded slices each side
    assert torch.all(x[:, :, :8] == 0) and torch.all(x[:, :, -8:] == 0)  # 8 padded rows each side
    assert x[:, 2:-2, 8:-8].abs().sum() > 0
    no_spacing = prepare(vol, ImageSpec(size_px=(8, 32, 32), channels=1, normalize="zscore"))
    assert no_spacing.shape == (1, 8, 32, 32)
    # no spacing asked: resized to fit, never padded, so no slice, row or column is all zeros (padding;
    # z-scored background is below zero, not zero)
    nonzero = no_spacing[0] != 0  # (D, H, W)
    assert nonzero.any(dim=(1, 2)).all() and nonzero.any(dim=(0, 2)).all() and nonzero.any(dim=(0, 1)).all()


def test_center_crop_or_pad_keeps_the_centre() -> None:
    x = torch.arange(5 * 6, dtype=torch.float32).reshape(1, 5, 6)
    out = center_crop_or_pad(x, (3, 8))
    assert out.shape == (1, 3, 8)
    assert torch.equal(out[0, :, 1:7], x[0, 1:4]) and torch.all(out[0, :, [0, 7]] == 0)


# --- augmentation ---------------------------------------------------------------------------------


def test_2d_augmentation_draws_within_paper_limits() -> None:
    gen = torch.Generator().manual_seed(0)
    draws = [draw_2d(gen) for _ in range(2000)]
    angles = np.array([a for a, _ in draws])
    flips = np.mean([f for _, f in draws])
    assert angles.min() >= -45 and angles.max() <= 45 and angles.min() < -40 and angles.max() > 40
    assert 0.45 < flips < 0.55
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(2, 4, 4)
    assert torch.equal(apply_2d(x, 0.0, True), x.flip(-2))  # vertical flip: upside down
    a = augment_2d(x, torch.Generator().manual_seed(7))
    b = augment_2d(x, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)  # seeded: repeatable


def test_2d_rotation_turns_content_counter_clockwise() -> None:
    x = torch.zeros(1, 33, 33)
    x[0, 16, 24:30] = 1.0  # a bar right of centre
    rotated = apply_2d(x, 45.0, False)
    ys, xs = torch.nonzero(rotated[0] > 0.5, as_tuple=True)
    assert (ys < 16).all() and (xs > 16).all()  # moved up-right


def test_3d_flips_each_axis_half_the_time() -> None:
    gen = torch.Generator().manual_seed(1)
    draws = [draw_3d(gen) for _ in range(3000)]
    for axis in (-3, -2, -1):
        assert 0.45 < np.mean([axis in d for d in draws]) < 0.55
    vol = torch.randn(1, 4, 5, 6)
    for seed in (0, 2, 6):  # seed 0 flips D and W, 2 only H, 6 none (one torch.rand per axis, D, H, W)
        gen = torch.Generator().manual_seed(seed)
        axes = [axis for axis in (-3, -2, -1) if torch.rand((), generator=gen) < 0.5]
        assert axes == {0: [-3, -1], 2: [-2], 6: []}[seed]
        out = augment_3d(vol, torch.Generator().manual_seed(seed))
        assert torch.equal(out, vol.flip(axes) if axes else vol)


def test_dicom_series_folder_is_one_ordered_volume(shared_data: Path, tmp_path: Path) -> None:
    """Six slices written from the real MR slice in shuffled file order: sorted along the normal."""
    series = tmp_path / "series"
    series.mkdir()
    ds = pydicom.dcmread(shared_data / "mri" / "MR_small.dcm")
    base = ds.pixel_array.astype(np.int16)
    z0 = float(ds.ImagePositionPatient[2])
    for name, k in zip("dbfaec", range(6), strict=True):  # file names do not follow the anatomy
        ds.ImagePositionPatient = [ds.ImagePositionPatient[0], ds.ImagePositionPatient[1], z0 + 2.5 * k]
        ds.InstanceNumber = 6 - k
        ds.PixelData = (base + 100 * k).astype(np.int16).tobytes()
        ds.save_as(series / f"{name}.dcm")
    vol = read_image(series, spatial_dims=3)
    assert vol.pixels.shape == (6, 64, 64, 1)
    assert vol.spacing_mm == pytest.approx((2.5, 0.3125, 0.3125))
    means = vol.pixels.mean(axis=(1, 2, 3))
    assert np.all(np.diff(means) > 0)  # inferior (k=0) to superior (k=5): brighter by 100 each
    with pytest.raises(ImageReadError, match="6 slices"):
        read_image(series, spatial_dims=2)


def test_dicom_voi_lut_sequence_is_applied(shared_data: Path, tmp_path: Path) -> None:
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    ds = pydicom.dcmread(shared_data / "mri" / "MR_small.dcm")
    raw = ds.pixel_array.astype(np.float64)  # 127..2145
    lut = Dataset()
    lut.LUTDescriptor = [4096, 0, 12]  # 4,096 entries from stored value 0, 12-bit output
    lut.add_new(0x00283006, "US", [min(4095, 2 * v) for v in range(4096)])  # LUTData, 16-bit words
    ds.VOILUTSequence = Sequence([lut])
    del ds.WindowCenter, ds.WindowWidth
    ds.save_as(tmp_path / "lut.dcm")
    img = read_image(tmp_path / "lut.dcm")
    assert img.value_range == (0.0, 1.0)
    np.testing.assert_allclose(img.pixels[..., 0], np.minimum(4095, 2 * raw) / 4095, atol=1e-6)
