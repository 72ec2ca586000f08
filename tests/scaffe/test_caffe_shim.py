"""tools/caffe_shim: with it on PYTHONPATH, code written for BVLC Caffe imports `caffe` and its submodules and
gets scaffe's, each module once."""
import os
import subprocess
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parents[2] / "tools" / "caffe_shim"

CAFFE_SCRIPT = """
import sys
import caffe
import caffe.draw
import caffe.io
from caffe import layers as L, params as P
from caffe.coord_map import coord_map_from_to, crop
from caffe.proto import caffe_pb2
import scaffe
import scaffe.coord_map
import scaffe.draw
import scaffe.proto.caffe_pb2

assert caffe is scaffe and caffe_pb2 is scaffe.proto.caffe_pb2 and caffe.draw is scaffe.draw
assert caffe.coord_map is scaffe.coord_map and coord_map_from_to is scaffe.coord_map.coord_map_from_to
assert sys.modules["caffe.io"] is sys.modules["scaffe.io"]
try:
    import caffe.no_such_module
except ModuleNotFoundError as error:
    assert error.name == "caffe.no_such_module", error.name
else:
    raise AssertionError("caffe.no_such_module imported")
n = caffe.NetSpec()
n.data = L.Input(shape=dict(dim=[1, 1, 8, 8]))
n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=3, pad=1)
n.crop = crop(n.pool, n.data)
net = n.to_proto()
assert [layer.type for layer in net.layer] == ["Input", "Pooling", "Crop"]
assert isinstance(net, caffe_pb2.NetParameter) and caffe.TEST == caffe_pb2.TEST
assert caffe.draw.draw_net(net, "LR", ext="raw").startswith(b"digraph")
# Every name BVLC Caffe's caffe/__init__.py exports, but NCCL (has_nccl() is False).
for name in ("Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver", "AdamSolver",
             "Timer", "init_log", "log", "set_mode_cpu", "set_mode_gpu", "set_device", "Layer", "get_solver",
             "layer_type_list", "set_random_seed", "solver_count", "set_solver_count", "solver_rank",
             "set_solver_rank", "set_multiprocess", "has_nccl", "TRAIN", "TEST", "Classifier", "Detector", "io",
             "layers", "params", "NetSpec", "to_proto"):
    assert hasattr(caffe, name), name
assert callable(caffe.log) and not caffe.has_nccl()
print("ok", len(caffe.layer_type_list()))
"""


def test_caffe_names_resolve_to_scaffe_modules():
    env = dict(os.environ, PYTHONPATH=str(SHIM))
    done = subprocess.run([sys.executable, "-c", CAFFE_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
