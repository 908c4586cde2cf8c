"""The model zoo: torchvision's parameter counts, forward shapes, weights loading, errors."""

import pytest
import torch

import lowbit.models as zoo

# torchvision's published parameter counts at 1000 classes
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
                      "vgg16": 138_357_544, "alexnet": 61_100_840}


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_counts_equal_torchvision(name):
    with torch.device("meta"):
        model = zoo.get(name)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMS[name]


def test_apnn_vgg_variant_layers():
    with torch.device("meta"):
        model = zoo.get("apnn_vgg_variant", num_classes=10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    fcs = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [c.out_channels for c in convs] == [128, 128, 256, 256, 512, 512]
    assert [(f.in_features, f.out_features) for f in fcs] == [(8192, 1024), (1024, 1024),
                                                             (1024, 10)]
    with pytest.raises(ValueError, match="image_size"):
        zoo.get("apnn_vgg_variant", image_size=30)


@pytest.mark.parametrize("name,shape", [
    ("resnet18", (3, 3, 32, 48)), ("resnet34", (1, 3, 40, 32)), ("resnet50", (2, 3, 32, 32)),
    ("vgg16", (3, 3, 32, 64)), ("alexnet", (1, 3, 96, 128)), ("apnn_vgg_variant", (3, 3, 32, 32)),
    ("digits_cnn", (5, 1, 8, 8)), ("digits_resnet", (5, 1, 8, 8))])
def test_forward_shapes(name, shape):
    model = zoo.get(name, num_classes=7, width=0.125).eval()
    with torch.no_grad():
        out = model(torch.randn(shape))
    assert out.shape == (shape[0], 7) and bool(torch.isfinite(out).all())


def test_names_and_networks():
    assert set(zoo.NETWORKS) <= set(zoo.names())
    assert zoo.NETWORKS == ("resnet18", "resnet34", "resnet50", "vgg16", "alexnet",
                            "apnn_vgg_variant")


def test_weights_round_trip(tmp_path):
    a = zoo.get("resnet18", num_classes=10, width=0.125).eval()
    path = tmp_path / "r18.pth"
    torch.save(a.state_dict(), path)
    checked = 0
    for weights in (a.state_dict(), str(path), path):
        b = zoo.get("resnet18", num_classes=10, width=0.125, weights=weights).eval()
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            assert torch.equal(a(x), b(x))
        checked += 1
    assert checked == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown model 'resnet19'"):
        zoo.get("resnet19")
    with pytest.raises(ValueError, match="num_classes"):
        zoo.get("resnet18", num_classes=0)
    with pytest.raises(ValueError, match="width"):
        zoo.get("resnet18", width=-1)
    with pytest.raises(ValueError, match="do not fit resnet18"):
        zoo.get("resnet18", weights=zoo.get("resnet34", width=0.125).state_dict())
    with pytest.raises(ValueError, match="does not exist"):
        zoo.get("alexnet", weights="/nonexistent/weights.pth")
    with pytest.raises(TypeError, match="weights"):
        zoo.get("alexnet", weights=3)
    with pytest.raises(TypeError, match="image_size"):
        zoo.get("resnet18", image_size=32)


def test_zoo_models_name_their_architecture_for_save(tmp_path):
    """lowbit.save rebuilds a zoo model from its own `lowbit_arch`: no arch= needed."""
    import lowbit

    m = zoo.get("digits_cnn", num_classes=10, width=0.5)
    assert m.lowbit_arch == {"zoo": "digits_cnn", "kwargs": {"num_classes": 10, "width": 0.5}}
    q = lowbit.quantize(m, weight_bits=2, act_bits=2)
    lowbit.calibrate(q, [torch.randn(4, 1, 8, 8)])
    c = lowbit.convert(q)
    lowbit.save(c, tmp_path / "m.safetensors")
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(c(x), lowbit.load(tmp_path / "m.safetensors")(x))
