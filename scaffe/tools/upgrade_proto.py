"""upgrade_net_proto_text, upgrade_net_proto_binary and upgrade_solver_proto_text: Caffe's tools that
rewrite an old net (prototxt or .caffemodel) or solver in today's format (the steps: scaffe.upgrade).

CLI (Caffe's arguments): upgrade_net_proto_text IN OUT (and the same for the other two). Exit
status 0 when nothing was lost, 1 when some old field had no place in the new format (logged;
the file is written anyway, as Caffe does), 2 when the input cannot be read or upgraded.
"""
import sys

from scaffe.io import (CaffeFormatError, read_binary_proto, read_text_proto, write_binary_proto,
                       write_prototxt)
from scaffe.log import get_logger
from scaffe.proto import caffe_pb2
from scaffe.upgrade import net_needs_upgrade, solver_needs_upgrade, upgrade_net, upgrade_solver

__all__ = ["main", "TOOLS"]

log = get_logger(__name__)

# tool name -> (message, "text" or "binary", needs upgrade?, upgrade in place)
TOOLS = {
    "upgrade_net_proto_text": (caffe_pb2.NetParameter, "text", net_needs_upgrade, upgrade_net),
    "upgrade_net_proto_binary": (caffe_pb2.NetParameter, "binary", net_needs_upgrade, upgrade_net),
    "upgrade_solver_proto_text": (caffe_pb2.SolverParameter, "text", solver_needs_upgrade, upgrade_solver),
}


def main(tool, argv):
    """Runs upgrade tool `tool` on argv [IN, OUT]; returns the exit status."""
    message_class, form, needs_upgrade, upgrade = TOOLS[tool]
    if len(argv) != 2 or argv[0].startswith("-"):
        print(f"usage: {tool} OLD_{form.upper()}_FILE_IN NEW_{form.upper()}_FILE_OUT", file=sys.stderr)
        return 1
    source, target = argv
    what = message_class.DESCRIPTOR.name
    try:
        read = read_text_proto if form == "text" else read_binary_proto
        msg = read(source, message_class, f"{form} {what}")
        complete = True
        if needs_upgrade(msg):
            complete = upgrade(msg, source)
            if not complete:
                log.error("Encountered error(s) while upgrading %s; see details above.", source)
        else:
            log.error("File already in latest proto format: %s", source)
    except CaffeFormatError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 2
    (write_prototxt if form == "text" else write_binary_proto)(msg, target)
    log.info("Wrote upgraded %s %s proto to %s", what, form, target)
    return 0 if complete else 1
