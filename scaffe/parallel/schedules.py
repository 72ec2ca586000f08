"""The factory of distributed schedules: one class per file, the same `attach` for all."""
import importlib

SCHEDULES = {
    "scaffe": "scaffe.parallel.scaffe_schedule:SCaffeSchedule",
    "allreduce": "scaffe.parallel.allreduce_schedule:AllreduceSchedule",
    "native": "scaffe.parallel.native_schedule:NativeSchedule",
}


def attach(solver, comm, schedule="scaffe"):
    """Hook schedule `schedule` into `solver` (and its train net); returns the schedule object."""
    try:
        module_name, class_name = SCHEDULES[schedule].split(":")
    except KeyError:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(sorted(SCHEDULES))}") from None
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(solver, comm)
