"""`python -m perf.timer_slack NS COMMAND ...`: run COMMAND with the Linux timer slack NS nanoseconds.

A sleeping call may overshoot its time by the timer slack (50 us by default), which is kept across exec and
by every thread the process starts. MPICH's blocking collectives poll while they wait; told to nanosleep when
they yield (MPIR_CVAR_ENABLE_HEAVY_YIELD=1) each yield sleeps about the timer slack, so on the time-dilated bed
(perf/cluster_sim.py) a slack D times longer keeps a spinning rank's yields as short undilated as they were and
its CPU D times smaller (perf/RESULTS.md, "MPICH's spin under a dilated timer slack").
"""
import ctypes
import os
import sys

PR_SET_TIMERSLACK = 29  # linux/prctl.h


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        raise SystemExit("usage: python -m perf.timer_slack NS COMMAND [ARG ...]")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(int(argv[0])), 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_TIMERSLACK): {os.strerror(ctypes.get_errno())}")
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main()
