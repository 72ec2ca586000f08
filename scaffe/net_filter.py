"""Which layers a net keeps for its NetState: Caffe's Net::FilterNet and Net::StateMeetsRule.

A layer's include/exclude rules name a phase, a level range and stages; the net built for one
state keeps only the layers whose rules accept it. `NetError` lives here, the first step of
building a net, so every step after it raises the same error.
"""
from scaffe.log import get_logger
from scaffe.proto import caffe_pb2

log = get_logger(__name__)

__all__ = ["NetError", "filter_net", "state_meets_rule"]


class NetError(ValueError):
    """A net could not be built or loaded; the message is one line naming the file and the layer."""


def state_meets_rule(state, rule, layer_name):
    """Caffe's StateMeetsRule: whether NetState `state` satisfies the NetStateRule `rule`."""
    if rule.HasField("phase") and rule.phase != state.phase:
        log.info("The NetState phase (%d) differed from the phase (%d) specified by a rule in layer %s",
                 state.phase, rule.phase, layer_name)
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        log.info("The NetState level (%d) is above the min_level (%d) specified by a rule in layer %s",
                 state.level, rule.min_level, layer_name)
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        log.info("The NetState level (%d) is above the max_level (%d) specified by a rule in layer %s",
                 state.level, rule.max_level, layer_name)
        return False
    # The state must hold every stage the rule names, and none of its not_stages.
    for stage in rule.stage:
        if stage not in state.stage:
            log.info("The NetState did not contain stage '%s' specified by a rule in layer %s", stage, layer_name)
            return False
    for stage in rule.not_stage:
        if stage in state.stage:
            log.info("The NetState contained a not_stage '%s' specified by a rule in layer %s", stage, layer_name)
            return False
    return True


def filter_net(param, source="<net>"):
    """A copy of `param` keeping only the layers whose include/exclude rules accept `param.state`."""
    filtered = caffe_pb2.NetParameter()
    filtered.CopyFrom(param)
    del filtered.layer[:]
    for layer in param.layer:
        if len(layer.include) and len(layer.exclude):
            raise NetError(f"{source}: layer '{layer.name}': specify either include rules or exclude rules, not both")
        # No include rule: included unless an exclude rule matches; else included if one include matches.
        included = not len(layer.include)
        for rule in layer.exclude:
            if included and state_meets_rule(param.state, rule, layer.name):
                included = False
        for rule in layer.include:
            if not included and state_meets_rule(param.state, rule, layer.name):
                included = True
        if included:
            filtered.layer.add().CopyFrom(layer)
    return filtered
