"""Train LeNet for a few iterations (under mpiexec or alone) and save the root's weights.

argv: schedule iterations batch_per_rank out.npz [solver_field=value ...]
"""
import sys

import numpy
from mpi4py import MPI

import collectives
from scaffe import io as sio
from scaffe.parallel.launch import make_distributed
from scaffe.solvers import create_solver, read_solver_file

collectives.install_abort_hook()
schedule, iterations, batch, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
comm = MPI.COMM_WORLD
param = read_solver_file("examples/mnist/lenet_solver.prototxt")
param.max_iter = iterations
param.test_interval = 0
del param.test_iter[:]
param.snapshot = 0
param.snapshot_after_train = False
param.display = 0
param.random_seed = 5
for setting in sys.argv[5:]:
    field, value = setting.split("=")
    setattr(param, field, type(getattr(param, field))(value))
net = sio.read_net_prototxt("examples/mnist/lenet_train_test.prototxt")
for layer in net.layer:
    if layer.type == "Data":
        layer.data_param.batch_size = batch
param.ClearField("net")
param.net_param.CopyFrom(net)
solver = create_solver(param, source="examples/mnist/lenet_solver.prototxt", root_solver=comm.rank == 0)
if comm.size > 1:
    make_distributed(solver, comm, schedule)
solver.solve()
if comm.rank == 0:
    numpy.savez(out, *[numpy.asarray(b.data) for b in solver.net.learnable_params])
