"""Caffe's gflags spellings of command-line flags, taken out of an argument list: `-name=value`,
`--name value`, and for booleans `-name`, `--name=false`, `--noname`."""

__all__ = ["gflags_bool", "take_flags"]

_TRUE = ("1", "true", "yes", "y", "t")
_FALSE = ("0", "false", "no", "n", "f")


def gflags_bool(text):
    """True or False for a gflags boolean's value ("true", "0", "Yes", ...), None for anything else."""
    word = text.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def take_flags(argv, valued, booleans=()):
    """(argv without the flags named in `valued` and `booleans`, {name: value text} of those it held; a
    boolean's text is "true" or "false" when given without a value). A later flag wins over an earlier one;
    a flag in `valued` given last without its value is a ValueError."""
    rest, flags = [], {}
    args = iter(argv)
    for arg in args:
        name, has_value, value = arg.lstrip("-").partition("=")
        negated = name.startswith("no") and name[2:] in booleans
        if not arg.startswith("-") or not (name in valued or name in booleans or negated):
            rest.append(arg)
        elif negated or name in booleans:
            if negated and has_value:
                raise ValueError(f"--{name} takes no value, got {arg!r}")
            flags[name[2:] if negated else name] = "false" if negated else (value if has_value else "true")
        else:
            value = value if has_value else next(args, None)
            if value is None:
                raise ValueError(f"--{name} needs a value")
            flags[name] = value
    return rest, flags
