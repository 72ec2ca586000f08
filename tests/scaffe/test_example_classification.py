"""examples/classification.py, Caffe's classification tutorial as a script: a trained LeNet classifies
the bundled MNIST digit (a 7) through caffe.io.Transformer and caffe.Classifier alike."""
import importlib.util
from pathlib import Path

import numpy
from PIL import Image

from scaffe.pycaffe import TEST, Net

ROOT = Path(__file__).resolve().parents[2]


def load_example():
    spec = importlib.util.spec_from_file_location("classification_example", ROOT / "examples" / "classification.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_classification_example(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    example = load_example()
    weights = example.train_lenet(30, str(tmp_path))
    probabilities = example.classify(weights, example.IMAGE)
    # Oracle: the net itself on the PNG's pixels scaled as in training (pixels / 256).
    pixels = numpy.asarray(Image.open(example.IMAGE), dtype=numpy.float32)
    net = Net(example.MODEL_DEF, weights, TEST)
    net.blobs["data"].reshape(1, 1, 28, 28)
    net.reshape()
    expected = net.forward(data=(pixels * example.SCALE)[None, None])["prob"][0]
    for prob in probabilities.values():
        numpy.testing.assert_allclose(prob, expected, rtol=1e-4, atol=1e-6)
    assert abs(expected.sum() - 1) < 1e-5
    assert expected.argmax() == 7 and expected[7] > 0.5  # the bundled image is a 7
    example.main(["--weights", weights])
    printed = capsys.readouterr().out
    assert "predicted class is: 7" in printed and "caffe.Classifier agrees: True" in printed
