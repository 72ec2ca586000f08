"""Caffe's classification tutorial (examples/00-classification.ipynb) as a script, on the bundled LeNet
and MNIST: load a trained net, prepare an image with caffe.io.Transformer, print class probabilities,
then the same through caffe.Classifier.

Run from the repository root:  python examples/classification.py [--weights W.caffemodel] [--image IMG]
Without --weights it uses examples/mnist/lenet_iter_2000.caffemodel (what
`scaffe train --solver=examples/mnist/lenet_solver.prototxt` writes), or, where that is missing,
trains LeNet for --train-iterations first (the notebook downloads a trained model instead).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import scaffe as caffe

MODEL_DEF = "examples/mnist/lenet_deploy.prototxt"
TRAINED = "examples/mnist/lenet_iter_2000.caffemodel"
IMAGE = "examples/images/mnist_7.png"
SCALE = 0.00390625  # the transform_param scale LeNet was trained with: pixels / 256


def train_lenet(iterations, folder):
    """LeNet trained for `iterations` on the bundled MNIST; returns the .caffemodel path."""
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb("examples/mnist")
    caffe.set_random_seed(1)
    solver = caffe.SGDSolver("examples/mnist/lenet_solver.prototxt")
    solver.step(iterations)
    weights = os.path.join(folder, "lenet.caffemodel")
    solver.net.save(weights)
    solver.close()
    return weights


def classify(weights, image_file):
    """{"transformer": probabilities from Net + Transformer, "classifier": from caffe.Classifier}."""
    caffe.set_mode_cpu()
    net = caffe.Net(MODEL_DEF, weights=weights, phase=caffe.TEST)

    # Input preprocessing: load_image gives H x W x 1 in [0, 1]; the net wants 1 x 28 x 28 of pixels / 256.
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))  # move channels to the outermost dimension
    transformer.set_raw_scale("data", 255)        # rescale from [0, 1] to [0, 255]
    transformer.set_input_scale("data", SCALE)    # then as in training

    image = caffe.io.load_image(image_file, color=False)
    net.blobs["data"].reshape(1, 1, 28, 28)       # one image instead of the deploy batch of 64
    net.reshape()
    net.blobs["data"].data[...] = transformer.preprocess("data", image)
    by_transformer = net.forward()["prob"][0].copy()

    classifier = caffe.Classifier(MODEL_DEF, weights, image_dims=(28, 28), raw_scale=255, input_scale=SCALE)
    by_classifier = classifier.predict([image], oversample=False)[0]  # no mirrored crops for digits
    return {"transformer": by_transformer, "classifier": by_classifier}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", help=f"trained LeNet .caffemodel (default {TRAINED})")
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument("--train-iterations", type=int, default=500,
                        help="iterations to train LeNet for when no trained weights exist")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        weights = args.weights or (TRAINED if os.path.exists(TRAINED) else None)
        if weights is None:
            print(f"{TRAINED} not found: training LeNet for {args.train_iterations} iterations first")
            weights = train_lenet(args.train_iterations, folder)
        probabilities = classify(weights, args.image)
    prob = probabilities["transformer"]
    print(f"image: {args.image}")
    print("class probabilities:", " ".join(f"{digit}:{p:.4f}" for digit, p in enumerate(prob)))
    print(f"predicted class is: {prob.argmax()}")
    print("caffe.Classifier agrees:", bool(np.allclose(probabilities["classifier"], prob, rtol=1e-4, atol=1e-6)))
    return probabilities


if __name__ == "__main__":
    main(sys.argv[1:])
