"""scaffe's pycaffe-style Python API on the bundled MNIST LeNet: train, score, save, classify.

Run from the repository root:  python examples/python_api.py [iterations]   (default 200)
A script written for BVLC Caffe reads the same with `import scaffe as caffe`.
"""
import os
import sys
import tempfile

import numpy as np

import scaffe
from scaffe.tools.convert_mnist import ensure_mnist_lmdb


def main(iterations=200):
    ensure_mnist_lmdb(os.path.join("examples", "mnist"))  # the LMDBs lenet_train_test.prototxt reads
    scaffe.set_mode_cpu()
    scaffe.set_random_seed(1)

    # Training: the solver's nets are ordinary nets; step() runs Caffe's iterations.
    solver = scaffe.get_solver("examples/mnist/lenet_solver.prototxt")
    print("train net blobs:", ", ".join(f"{name} {blob.data.shape}" for name, blob in solver.net.blobs.items()))
    print("learnable layers:", ", ".join(f"{name} {[p.data.shape for p in params]}"
                                         for name, params in solver.net.params.items()))
    for done in range(0, iterations, 50):
        solver.step(min(50, iterations - done))
        print(f"iteration {solver.iter}: loss {float(solver.net.blobs['loss'].data):.4f}")

    # Scoring: the test net shares the training weights; each forward() reads the next test batch.
    test_net = solver.test_nets[0]
    batches = solver.param.test_iter[0]
    accuracy = np.mean([float(test_net.forward()["accuracy"]) for _ in range(batches)])
    print(f"test accuracy: {accuracy:.4f}")

    # Deploy: save the weights, load them into the Input-fed net and classify the last test batch.
    images = test_net.blobs["data"].data[:8].copy()
    labels = test_net.blobs["label"].data[:8].astype(int)
    with tempfile.TemporaryDirectory() as folder:
        weights = os.path.join(folder, "lenet.caffemodel")
        solver.net.save(weights)
        deploy = scaffe.Net("examples/mnist/lenet_deploy.prototxt", weights, scaffe.TEST)
    deploy.blobs["data"].reshape(*images.shape)   # a batch of 8 instead of the prototxt's 64
    deploy.reshape()
    probabilities = deploy.forward(data=images)["prob"]
    print("predicted:", probabilities.argmax(axis=1).tolist())
    print("labels:   ", labels.tolist())
    solver.close()
    return accuracy


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
