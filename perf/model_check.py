"""The compute model against a measured `scaffe time` (or BVLC `caffe time`) log, layer by layer.

    python -m perf.model_check LOG --model NET.prototxt [--gpu h100] [--tolerance 0.25]

Prints each layer's measured and modelled forward and backward (ms, at the log's batch), their ratio, and
`RESULT model_check ...` with the totals, how many layer passes the model gets within the tolerance, what
share of the measured time those passes hold, and the single efficiency (scaffe.modelled.gpus.EFFICIENCY's
place) that would make the modelled total equal the measured one. jobs/gpu_acceptance.sh keeps the logs
and the nets (LOGS/profile_<net>_b<batch>.log, LOGS/<net>_b<batch>.prototxt).
"""
import argparse
import sys

from scaffe import io as sio
from scaffe.modelled import gpus
from scaffe.modelled.profile import TOP_SHAPE, read_time_log
from scaffe.modelled.shapes import DATA_TYPES, layer_models

MEASURABLE_MS = 0.05  # passes shorter than this, measured and modelled, are timer noise and launch cost alone


def _modelled_ms(gpu, layer, efficiency):
    """The layer's (forward, backward) ms on `gpu` with `efficiency` in place of the model's."""
    return [1e3 * gpus.layer_seconds(gpu, flops, nbytes, kernels, efficiency)
            for flops, nbytes, kernels in zip(layer.flops, layer.bytes, layer.kernels)]


def compare(log, model, gpu="h100", tolerance=0.25):
    """Rows (layer, type, pass, measured ms, modelled ms) and a summary dict."""
    with open(log, errors="replace") as f:
        batch = int(TOP_SHAPE.search(f.read()).group(1))
    forward, backward = read_time_log(log, batch)
    layers = [layer for layer in layer_models(sio.read_net_prototxt(model)) if layer.type not in DATA_TYPES]
    rows = []
    for layer in layers:
        modelled = _modelled_ms(gpu, layer, gpus.EFFICIENCY)
        for k, (name, measured) in enumerate((("forward", forward), ("backward", backward))):
            if layer.name in measured:
                rows.append((layer.name, layer.type, name, 1e3 * measured[layer.name], modelled[k]))
    measured_ms = sum(r[3] for r in rows)
    modelled_ms = sum(r[4] for r in rows)
    judged = [r for r in rows if max(r[3], r[4]) >= MEASURABLE_MS]
    within = [r for r in judged if abs(r[4] - r[3]) <= tolerance * r[3]]
    # The efficiency that makes the modelled total the measured one (launch floors held), by bisection.
    low, high = 1e-3, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        total = sum(sum(_modelled_ms(gpu, layer, middle)) for layer in layers)
        low, high = (low, middle) if total < measured_ms else (middle, high)
    summary = dict(batch=batch, measured_ms=measured_ms, modelled_ms=modelled_ms, passes=len(judged),
                   within=len(within), within_share=sum(r[3] for r in within) / measured_ms,
                   fitted_efficiency=(low + high) / 2)
    return rows, summary


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.model_check", description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--model", required=True, help="the net the log timed (its train prototxt)")
    p.add_argument("--gpu", default="h100", choices=sorted(gpus.GPUS))
    p.add_argument("--tolerance", type=float, default=0.25)
    args = p.parse_args(argv)
    rows, s = compare(args.log, args.model, args.gpu, args.tolerance)
    print(f"{'layer':>24} {'type':>18} {'pass':>8} {'measured':>9} {'modelled':>9} {'ratio':>6}")
    for name, type_, direction, measured, modelled in rows:
        ratio = f"{modelled / measured:6.2f}" if measured > 0 else "     -"
        print(f"{name:>24} {type_:>18} {direction:>8} {measured:9.3f} {modelled:9.3f} {ratio}")
    print(f"RESULT model_check gpu={args.gpu} batch={s['batch']} measured_ms={s['measured_ms']:.2f} "
          f"modelled_ms={s['modelled_ms']:.2f} ratio={s['modelled_ms'] / s['measured_ms']:.2f} "
          f"within_{args.tolerance:g}={s['within']}/{s['passes']} within_share={s['within_share']:.2f} "
          f"fitted_efficiency={s['fitted_efficiency']:.3f} (model: {gpus.EFFICIENCY})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
