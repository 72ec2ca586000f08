"""cupy.cuda.runtime for the stand-in: one device, described with the fields scaffe reads."""

DEVICE_COUNT = 1


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount():  # noqa: N802 - cupy's name
    return DEVICE_COUNT


def getDeviceProperties(device):  # noqa: N802 - cupy's name
    if not 0 <= device < DEVICE_COUNT:
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
    return {"name": b"cupy stand-in (numpy)", "totalGlobalMem": 16 << 30, "major": 9, "minor": 0,
            "multiProcessorCount": 1, "clockRate": 1000000, "sharedMemPerBlock": 49152, "memoryClockRate": 1000000,
            "memoryBusWidth": 64, "l2CacheSize": 0, "maxThreadsPerBlock": 1024, "warpSize": 32}


def deviceSynchronize():  # noqa: N802 - cupy's name
    from cupy import _stand_in, cuda
    _stand_in.count("synchronize")
    cuda._synchronize_all()
